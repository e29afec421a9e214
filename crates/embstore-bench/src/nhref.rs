//! `index --reference DIR`: the authors' reference NeighborHash (C++) as a peer in the run.
//!
//! DIR holds the upstream headers (`neighbor_hash/`, `absl/`; see
//! `../shared/peers/neighborhash/README.md`). Our harness, `reference/nh_ref.cc`, is compiled
//! against them (`-I DIR`, never copied) into a temporary directory with `$CXX` (default `g++`),
//! then run as a child process: it builds `NeighborHashMap<uint64_t, uint64_t>` over the same keys
//! (payload = insertion index, 2 MiB-aligned memory with `MADV_HUGEPAGE`) and times one
//! repetition of `find`, `amac_find<32>` and `amac_find_with_index<32>` into an output array per
//! query-file path it reads on stdin, answering with one JSON line.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The harness source, compiled at run time.
const HARNESS: &str = include_str!("../reference/nh_ref.cc");

/// The reference's structures, in the order of [`RefProc::rep`]'s answer.
pub(crate) const NAMES: [&str; 3] = ["reference_scalar", "reference_batch", "reference_batch_out"];

/// A compiled harness in a temporary directory (removed on drop).
pub(crate) struct Reference {
    dir: tempfile::TempDir,
    exe: PathBuf,
    /// Compiler and its first `--version` line, for the report.
    pub(crate) compiler: String,
}

fn compiler() -> String {
    std::env::var("CXX").ok().filter(|c| !c.is_empty()).unwrap_or_else(|| "g++".into())
}

impl Reference {
    /// Compiles the harness against the headers in `peer`. `Ok(None)` (after a message on
    /// stderr) when the folder or the compiler is missing: the run goes on without the reference.
    pub(crate) fn prepare(peer: &Path) -> Result<Option<Reference>, String> {
        let skip = |why: String| {
            eprintln!("embstore-bench index: --reference: {why}; running without the reference");
            Ok(None)
        };
        let Ok(peer) = std::fs::canonicalize(peer) else {
            return skip(format!("{} not found", peer.display()));
        };
        if !peer.join("neighbor_hash/neighbor_hash.h").is_file() {
            return skip(format!("{} has no neighbor_hash/neighbor_hash.h", peer.display()));
        }
        let cxx = compiler();
        let version = match Command::new(&cxx).arg("--version").output() {
            Ok(o) if o.status.success() => {
                String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_string()
            }
            _ => return skip(format!("C++ compiler `{cxx}` not found (set $CXX)")),
        };
        let dir = tempfile::Builder::new()
            .prefix("embstore-nhref-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let src = dir.path().join("nh_ref.cc");
        let exe = dir.path().join("nh_ref");
        std::fs::write(&src, HARNESS).map_err(|e| format!("{}: {e}", src.display()))?;
        eprintln!(
            "compiling the reference harness: {cxx} -O3 -std=c++20 -DNDEBUG -I {}",
            peer.display()
        );
        let out = Command::new(&cxx)
            .args(["-O3", "-std=c++20", "-DNDEBUG", "-I"])
            .arg(&peer)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .map_err(|e| format!("{cxx}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "compiling the reference harness failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Some(Reference { dir, exe, compiler: format!("{cxx} ({version})") }))
    }

    /// Starts the harness over `keys` in a table of `slots`; returns once it is built.
    pub(crate) fn start(
        &self,
        keys: &[u64],
        slots: usize,
        batch: usize,
    ) -> Result<RefProc, String> {
        let kpath = self.dir.path().join(format!("keys-{slots}.u64"));
        write_u64(&kpath, keys)?;
        let mut child = Command::new(&self.exe)
            .arg(&kpath)
            .arg(slots.to_string())
            .arg(batch.to_string())
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", self.exe.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            return Err("reference harness: no pipes".into());
        };
        let mut p = RefProc {
            child,
            stdin: Some(stdin),
            stdout,
            dir: self.dir.path().to_path_buf(),
            qpath: PathBuf::new(),
            generation: 0,
        };
        let ready = p.line()?;
        let field = |k: &str| ready.get(k).and_then(serde_json::Value::as_u64);
        if field("bucket_count") != Some(slots as u64) || field("keys") != Some(keys.len() as u64) {
            return Err(format!(
                "reference table is not like ours ({slots} slots, {} keys): {ready}",
                keys.len()
            ));
        }
        Ok(p)
    }
}

fn write_u64(path: &Path, xs: &[u64]) -> Result<(), String> {
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A running harness with its table built.
pub(crate) struct RefProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    /// The current query file; a new name for every query set (the harness reloads on a new
    /// path only).
    qpath: PathBuf,
    generation: u64,
}

impl RefProc {
    fn line(&mut self) -> Result<serde_json::Value, String> {
        let mut s = String::new();
        match self.stdout.read_line(&mut s) {
            Ok(0) | Err(_) => Err("reference harness exited early".into()),
            Ok(_) => serde_json::from_str(&s).map_err(|e| format!("reference harness: {e}: {s}")),
        }
    }

    /// The queries of the following repetitions.
    pub(crate) fn set_queries(&mut self, q: &[u64]) -> Result<(), String> {
        if self.generation > 0 {
            let _ = std::fs::remove_file(&self.qpath);
        }
        self.generation += 1;
        self.qpath = self.dir.join(format!("queries-{}-{}.u64", self.child.id(), self.generation));
        write_u64(&self.qpath, q)
    }

    /// One repetition: (MOPS, checksum) of each of [`NAMES`].
    pub(crate) fn rep(&mut self) -> Result<[(f64, u64); 3], String> {
        let stdin = self.stdin.as_mut().ok_or("reference harness closed")?;
        writeln!(stdin, "{}", self.qpath.display())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("reference harness: {e}"))?;
        let v = self.line()?;
        let get = |k: &str| v.get(k).ok_or_else(|| format!("reference harness: no {k} in {v}"));
        let mut out = [(0.0, 0); 3];
        for (o, p) in out.iter_mut().zip(["scalar", "batch", "batch_out"]) {
            let mops = get(&format!("{p}_mops"))?.as_f64().unwrap_or(f64::NAN);
            let sum = get(&format!("{p}_checksum"))?.as_u64().ok_or("bad checksum")?;
            *o = (mops, sum);
        }
        Ok(out)
    }
}

impl Drop for RefProc {
    fn drop(&mut self) {
        drop(self.stdin.take()); // end of input: the harness exits
        let _ = self.child.wait();
    }
}
