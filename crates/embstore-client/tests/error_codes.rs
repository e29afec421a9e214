//! The client's one mapping from gRPC statuses to error kinds, row by row over every gRPC code,
//! and its round trip with the server's mapping wherever that has an inverse.

use embstore_client::from_status;
use embstore_common::ErrorKind;
use embstore_server::to_status;
use tonic::{Code, Status};

#[test]
fn every_grpc_code_maps_to_its_error_kind_with_the_message() {
    let table: [(Code, ErrorKind); 17] = [
        (Code::Ok, ErrorKind::Unavailable),
        (Code::Cancelled, ErrorKind::Unavailable),
        (Code::Unknown, ErrorKind::Unavailable),
        (Code::InvalidArgument, ErrorKind::InvalidArgument),
        (Code::DeadlineExceeded, ErrorKind::Unavailable),
        (Code::NotFound, ErrorKind::TableNotFound),
        (Code::AlreadyExists, ErrorKind::TableExists),
        (Code::PermissionDenied, ErrorKind::PermissionDenied),
        (Code::ResourceExhausted, ErrorKind::Capacity),
        (Code::FailedPrecondition, ErrorKind::Unavailable),
        (Code::Aborted, ErrorKind::Unavailable),
        (Code::OutOfRange, ErrorKind::Capacity),
        (Code::Unimplemented, ErrorKind::Unsupported),
        (Code::Internal, ErrorKind::Unavailable),
        (Code::Unavailable, ErrorKind::Unavailable),
        (Code::DataLoss, ErrorKind::Corruption),
        (Code::Unauthenticated, ErrorKind::PermissionDenied),
    ];
    for (code, kind) in table {
        let e = from_status(&Status::new(code, "table 'user' is not served here"));
        assert_eq!(e.kind(), kind, "{code:?}");
        assert_eq!(e.to_string(), "table 'user' is not served here", "{code:?}");
    }
}

#[test]
fn kinds_with_their_own_code_survive_the_wire() {
    for kind in [
        ErrorKind::InvalidArgument,
        ErrorKind::TableNotFound,
        ErrorKind::TableExists,
        ErrorKind::Capacity,
        ErrorKind::Corruption,
        ErrorKind::Unsupported,
        ErrorKind::PermissionDenied,
        ErrorKind::Unavailable,
    ] {
        assert_eq!(from_status(&Status::new(to_status(kind), "m")).kind(), kind, "{kind:?}");
    }
}

/// Every kind, not only those with a gRPC code of their own, survives gRPC: the status
/// carries it in its metadata (the framed path's ERROR frame: `framed::tests`).
#[test]
fn every_kind_survives_grpc_in_the_status_metadata() {
    for kind in ErrorKind::ALL {
        let grpc = embstore_proto::frame::with_kind(Status::new(to_status(kind), "m"), kind);
        let e = from_status(&grpc);
        assert_eq!((e.kind(), e.message()), (kind, "m"), "{kind:?}");
    }
}
