//! The file layer under the disk tier: [`Vfs`], with the real file system ([`RealFs`]) and a
//! fault-injecting one for crash tests ([`FaultFs`]).
//!
//! Every byte the disk tier writes or reads goes through a [`Vfs`], so a test can stop the
//! store at any write, fsync, rename or unlink (redb's approach) and then "crash": bytes a file
//! received after its last fsync are thrown away, as a power cut would.

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// A file open for appending.
pub trait WriteFile: Send {
    /// Appends all of `buf`.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes everything written so far durable (`fdatasync`).
    fn sync(&mut self) -> io::Result<()>;
}

/// A file open for positioned reads.
pub trait ReadFile: Send + Sync {
    /// Fills `buf` from `offset`; a short file is an `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
}

/// The operations the disk tier needs from a file system.
pub trait Vfs: Send + Sync + fmt::Debug {
    /// Creates `path`, which must not exist, for appending.
    fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>>;
    /// Opens the existing `path` for appending at its end.
    fn append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>>;
    /// Opens `path` for reading.
    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>>;
    /// Renames `from` over `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes `dir`'s entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A second name for the file `from` (a copy where hard links are not possible).
    fn link(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the files in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// `path` opened for batched reads that bypass the page cache (`O_DIRECT`), if this file
    /// layer offers them; `None` (the default): every read goes through [`Vfs::open`].
    fn open_direct(&self, _path: &Path) -> io::Result<Option<File>> {
        Ok(None)
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

struct RealWrite(File);

impl WriteFile for RealWrite {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

struct RealRead(File);

impl ReadFile for RealRead {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, offset)
    }

    fn size(&self) -> io::Result<u64> {
        self.0.metadata().map(|m| m.len())
    }
}

impl Vfs for RealFs {
    fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(RealWrite(f)))
    }

    fn append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        Ok(Box::new(RealWrite(OpenOptions::new().append(true).open(path)?)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        Ok(Box::new(RealRead(File::open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        match std::fs::hard_link(from, to) {
            Ok(()) => Ok(()),
            // Another file system (EXDEV) or one without links: copy, then make the copy durable.
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                std::fs::copy(from, to)?;
                File::open(to)?.sync_all()
            }
            Err(e) => Err(e),
        }
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn open_direct(&self, path: &Path) -> io::Result<Option<File>> {
        crate::disk::io::open_direct(path).map(|(file, _)| Some(file))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }
}

/// A [`RealFs`] that fails at the `n`-th mutating operation (write, fsync, rename, remove,
/// link, directory sync) and at every one after it, as if the machine had stopped there.
/// [`FaultFs::crash`] then throws away what no fsync covered: each file written through it is
/// cut back to the length it had at its last `sync` (a torn write keeps a prefix of its bytes
/// until then). Directory operations are taken as durable once done (ext4 with `data=ordered`
/// orders them behind the data they name only after an fsync; the tier fsyncs before relying
/// on them).
#[derive(Clone)]
pub struct FaultFs {
    inner: Arc<FaultState>,
}

struct FaultState {
    ops: AtomicU64,
    fail_at: AtomicU64,
    stopped: AtomicBool,
    /// While set, writes and file creation fail with "no space left on device".
    full: AtomicBool,
    /// While set, writes and creations of files whose name starts with this fail with "no
    /// space left on device" (a write keeps a prefix of its bytes, as a disk that fills up
    /// part-way through it does): a nearly full disk where small files still fit.
    full_for: Mutex<Option<String>>,
    /// Durable length of every file written through this layer.
    synced: Mutex<HashMap<PathBuf, u64>>,
}

impl fmt::Debug for FaultFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultFs")
            .field("ops", &self.ops())
            .field("fail_at", &self.inner.fail_at.load(Ordering::Relaxed))
            .finish()
    }
}

impl FaultFs {
    /// A layer that fails at the `fail_at`-th mutating operation (1-based; `u64::MAX`: never).
    pub fn new(fail_at: u64) -> Self {
        Self {
            inner: Arc::new(FaultState {
                ops: AtomicU64::new(0),
                fail_at: AtomicU64::new(fail_at),
                stopped: AtomicBool::new(false),
                full: AtomicBool::new(false),
                full_for: Mutex::new(None),
                synced: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Makes the disk full (writes and creations fail with `ENOSPC`) or frees it again.
    pub fn set_full(&self, full: bool) {
        self.inner.full.store(full, Ordering::Relaxed);
    }

    /// Makes writes and creations of files whose name starts with `prefix` fail with
    /// `ENOSPC` (`None`: no longer); other files are written as usual.
    pub fn set_full_for(&self, prefix: Option<&str>) {
        *self.inner.full_for.lock() = prefix.map(str::to_owned);
    }

    fn check_space(&self) -> io::Result<()> {
        if self.inner.full.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        Ok(())
    }

    /// Whether writes to `path` fail for want of space ([`FaultFs::set_full_for`]).
    fn full_for(&self, path: &Path) -> bool {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        self.inner.full_for.lock().as_deref().is_some_and(|p| name.starts_with(p))
    }

    /// Mutating operations so far.
    pub fn ops(&self) -> u64 {
        self.inner.ops.load(Ordering::Relaxed)
    }

    /// Whether the fault has fired.
    pub fn stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Relaxed)
    }

    /// Cuts every file written through this layer back to its last synced length (removing
    /// files never synced), as a power cut would; returns how many bytes were dropped.
    pub fn crash(&self) -> io::Result<u64> {
        let mut dropped = 0;
        for (path, &len) in self.inner.synced.lock().iter() {
            match std::fs::metadata(path) {
                Ok(m) if m.len() > len => {
                    dropped += m.len() - len;
                    OpenOptions::new().write(true).open(path)?.set_len(len)?;
                }
                _ => {}
            }
        }
        Ok(dropped)
    }

    /// Counts one mutating operation; fails it (and every later one) at the fault.
    fn step(&self, what: &str) -> io::Result<()> {
        let n = self.inner.ops.fetch_add(1, Ordering::Relaxed) + 1;
        if self.stopped() || n >= self.inner.fail_at.load(Ordering::Relaxed) {
            self.inner.stopped.store(true, Ordering::Relaxed);
            return Err(io::Error::other(format!("injected fault at operation {n} ({what})")));
        }
        Ok(())
    }

    fn track(&self, path: &Path, len: u64) {
        self.inner.synced.lock().insert(path.to_path_buf(), len);
    }
}

struct FaultWrite {
    fs: FaultFs,
    path: PathBuf,
    file: File,
    len: u64,
}

impl WriteFile for FaultWrite {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.fs.check_space()?;
        if self.fs.full_for(&self.path) {
            // The disk fills up part-way through the write.
            let part = &buf[..buf.len() / 2];
            if self.file.write_all(part).is_ok() {
                self.len += part.len() as u64;
            }
            return Err(io::Error::from_raw_os_error(28));
        }
        if let Err(e) = self.fs.step("write") {
            // A torn write: half of the bytes reach the file before the stop.
            let _ = self.file.write_all(&buf[..buf.len() / 2]);
            return Err(e);
        }
        self.file.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.fs.step("fsync")?;
        self.file.sync_data()?;
        self.fs.track(&self.path, self.len);
        Ok(())
    }
}

impl Vfs for FaultFs {
    fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        self.check_space()?;
        self.step("create")?;
        // Creating an empty file takes no data blocks: it succeeds, and writing to it fails.
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        self.inner.synced.lock().entry(path.to_path_buf()).or_insert(0);
        Ok(Box::new(FaultWrite { fs: self.clone(), path: path.to_path_buf(), file, len: 0 }))
    }

    fn append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let file = OpenOptions::new().append(true).open(path)?;
        let len = file.metadata()?.len();
        self.inner.synced.lock().entry(path.to_path_buf()).or_insert(len);
        Ok(Box::new(FaultWrite { fs: self.clone(), path: path.to_path_buf(), file, len }))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        RealFs.open(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step("rename")?;
        RealFs.rename(from, to)?;
        let mut synced = self.inner.synced.lock();
        if let Some(len) = synced.remove(from) {
            synced.insert(to.to_path_buf(), len);
        }
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.step("remove")?;
        RealFs.remove(path)?;
        self.inner.synced.lock().remove(path);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.step("sync_dir")?;
        RealFs.sync_dir(dir)
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step("link")?;
        RealFs.link(from, to)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        RealFs.create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealFs.list(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_drops_what_no_fsync_covered() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new(4); // create, write, sync succeed; the second write fails
        let path = dir.path().join("f");
        let mut f = fs.create(&path).unwrap();
        f.write_all(b"durable").unwrap();
        f.sync().unwrap();
        let err = f.write_all(b"lost bytes").unwrap_err();
        assert!(err.to_string().contains("injected fault at operation 4"), "{err}");
        assert!(fs.stopped() && f.sync().is_err() && fs.remove(&path).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"durablelost ");
        assert_eq!(fs.crash().unwrap(), 5);
        assert_eq!(std::fs::read(&path).unwrap(), b"durable");
    }
}
