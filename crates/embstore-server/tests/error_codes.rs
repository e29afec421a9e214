//! The server's one mapping from error kinds to gRPC codes, row by row over every kind: a kind
//! added to `embstore-common` fails this test until it gets a row (and a deliberate code).

use embstore_common::ErrorKind;
use embstore_server::to_status;
use tonic::Code;

#[test]
fn every_error_kind_maps_to_its_grpc_code() {
    let table: [(ErrorKind, Code); 19] = [
        (ErrorKind::InvalidArgument, Code::InvalidArgument),
        (ErrorKind::ShapeMismatch, Code::InvalidArgument),
        (ErrorKind::NonFinite, Code::InvalidArgument),
        (ErrorKind::TableNotFound, Code::NotFound),
        (ErrorKind::KeyNotFound, Code::NotFound),
        (ErrorKind::TableExists, Code::AlreadyExists),
        (ErrorKind::Capacity, Code::ResourceExhausted),
        (ErrorKind::NoSpace, Code::ResourceExhausted),
        (ErrorKind::Corruption, Code::DataLoss),
        (ErrorKind::Unavailable, Code::Unavailable),
        (ErrorKind::Locked, Code::Unavailable),
        (ErrorKind::RollingBack, Code::Unavailable),
        (ErrorKind::Unsupported, Code::Unimplemented),
        (ErrorKind::PermissionDenied, Code::PermissionDenied),
        // Failures of the server itself, not of the request: the client may retry elsewhere.
        (ErrorKind::Io, Code::Internal),
        (ErrorKind::Closed, Code::Internal),
        (ErrorKind::NotFound, Code::Internal),
        (ErrorKind::UnknownName, Code::Internal),
        (ErrorKind::Backing, Code::Internal),
    ];
    let mut covered: Vec<ErrorKind> = table.iter().map(|&(k, _)| k).collect();
    for (kind, code) in table {
        assert_eq!(to_status(kind), code, "{kind:?}");
    }
    covered.sort_by_key(|k| format!("{k:?}"));
    let mut all = ErrorKind::ALL.to_vec();
    all.sort_by_key(|k| format!("{k:?}"));
    assert_eq!(covered, all, "every kind has exactly one row");
}
