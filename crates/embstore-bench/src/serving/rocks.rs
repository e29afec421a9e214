//! The benchmark's RocksDB-backed rows (cargo feature `rocksdb`): one RocksDB database per
//! shard, the rows as little-endian float32 values under 8-byte little-endian keys, read by
//! RocksDB's batched `MultiGet`. A server hosting these is the same embstore server with its
//! storage swapped, the paper's "RocksDB on the same machine" peer.
//!
//! Options (recorded in docs/benchmarks.md): no compression, 4 KiB blocks (the default), a
//! bloom filter of 10 bits per key, an LRU block cache of `cache_bytes` (sized like the shard's
//! rows by the caller), WAL off while loading, then a flush and a full compaction; every key
//! is read once afterwards so that the cache holds the whole shard ("everything fits").
//!
//! Linked against the system's `librocksdb` (Debian `librocksdb-dev`, RocksDB 7.8) through the
//! few functions of its C API declared here, so no bindgen or C++ build is needed.

use std::ffi::{c_char, c_int, c_uchar, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

use embstore_table::{Error, ErrorKind};

/// Opaque handles of the C API (`rocksdb/c.h`).
#[repr(C)]
struct Opaque {
    _private: [u8; 0],
}
type Db = Opaque;
type Options = Opaque;
type ReadOptions = Opaque;
type WriteOptions = Opaque;
type FlushOptions = Opaque;
type WriteBatch = Opaque;
type BlockOptions = Opaque;
type Cache = Opaque;
type FilterPolicy = Opaque;
type ColumnFamily = Opaque;
type Pinnable = Opaque;

const NO_COMPRESSION: c_int = 0;

#[link(name = "rocksdb")]
extern "C" {
    fn rocksdb_options_create() -> *mut Options;
    fn rocksdb_options_destroy(o: *mut Options);
    fn rocksdb_options_set_create_if_missing(o: *mut Options, v: c_uchar);
    fn rocksdb_options_set_compression(o: *mut Options, v: c_int);
    fn rocksdb_options_set_block_based_table_factory(o: *mut Options, t: *mut BlockOptions);
    fn rocksdb_block_based_options_create() -> *mut BlockOptions;
    fn rocksdb_block_based_options_destroy(t: *mut BlockOptions);
    fn rocksdb_block_based_options_set_block_cache(t: *mut BlockOptions, c: *mut Cache);
    fn rocksdb_block_based_options_set_filter_policy(t: *mut BlockOptions, f: *mut FilterPolicy);
    fn rocksdb_filterpolicy_create_bloom_full(bits_per_key: f64) -> *mut FilterPolicy;
    fn rocksdb_cache_create_lru(capacity: usize) -> *mut Cache;
    fn rocksdb_cache_destroy(c: *mut Cache);
    fn rocksdb_cache_get_usage(c: *mut Cache) -> usize;
    fn rocksdb_open_column_families(
        o: *const Options,
        name: *const c_char,
        n: c_int,
        names: *const *const c_char,
        cf_options: *const *const Options,
        handles: *mut *mut ColumnFamily,
        err: *mut *mut c_char,
    ) -> *mut Db;
    fn rocksdb_column_family_handle_destroy(h: *mut ColumnFamily);
    fn rocksdb_close(db: *mut Db);
    fn rocksdb_destroy_db(o: *const Options, name: *const c_char, err: *mut *mut c_char);
    fn rocksdb_writeoptions_create() -> *mut WriteOptions;
    fn rocksdb_writeoptions_destroy(w: *mut WriteOptions);
    fn rocksdb_writeoptions_disable_WAL(w: *mut WriteOptions, disable: c_int);
    fn rocksdb_writebatch_create() -> *mut WriteBatch;
    fn rocksdb_writebatch_destroy(b: *mut WriteBatch);
    fn rocksdb_writebatch_put(
        b: *mut WriteBatch,
        key: *const c_char,
        klen: usize,
        val: *const c_char,
        vlen: usize,
    );
    fn rocksdb_write(
        db: *mut Db,
        w: *const WriteOptions,
        b: *mut WriteBatch,
        err: *mut *mut c_char,
    );
    fn rocksdb_flushoptions_create() -> *mut FlushOptions;
    fn rocksdb_flushoptions_destroy(f: *mut FlushOptions);
    fn rocksdb_flushoptions_set_wait(f: *mut FlushOptions, v: c_uchar);
    fn rocksdb_flush(db: *mut Db, f: *const FlushOptions, err: *mut *mut c_char);
    fn rocksdb_compact_range(
        db: *mut Db,
        start: *const c_char,
        slen: usize,
        limit: *const c_char,
        llen: usize,
    );
    fn rocksdb_readoptions_create() -> *mut ReadOptions;
    fn rocksdb_readoptions_destroy(r: *mut ReadOptions);
    fn rocksdb_batched_multi_get_cf(
        db: *mut Db,
        r: *const ReadOptions,
        cf: *mut ColumnFamily,
        n: usize,
        keys: *const *const c_char,
        key_sizes: *const usize,
        values: *mut *mut Pinnable,
        errs: *mut *mut c_char,
        sorted_input: bool,
    );
    fn rocksdb_pinnableslice_value(p: *const Pinnable, len: *mut usize) -> *const c_char;
    fn rocksdb_pinnableslice_destroy(p: *mut Pinnable);
    fn rocksdb_free(p: *mut c_void);
}

/// Turns a C API error string into an error (and frees it).
fn check(err: *mut c_char, what: &str) -> embstore_table::Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null `errptr` from the C API is a malloc()ed NUL-terminated string that
    // we own; it is read once and freed once.
    let msg = unsafe {
        let m = CStr::from_ptr(err).to_string_lossy().into_owned();
        rocksdb_free(err.cast());
        m
    };
    Err(Error::new(ErrorKind::Io, format!("rocksdb {what}: {msg}")))
}

/// One RocksDB database holding one shard's rows (see the module docs).
pub(crate) struct RocksRows {
    db: *mut Db,
    cf: *mut ColumnFamily,
    options: *mut Options,
    table: *mut BlockOptions,
    cache: *mut Cache,
    read: *mut ReadOptions,
    path: PathBuf,
    dim: usize,
    len: usize,
}

// SAFETY: RocksDB's `DB` is thread-safe for concurrent reads (`MultiGet` from many threads);
// the option objects are only read after `open`, and everything is freed once, in `Drop`.
unsafe impl Send for RocksRows {}
// SAFETY: as above: `lookup` only calls `MultiGet`, which RocksDB allows from any thread.
unsafe impl Sync for RocksRows {}

impl std::fmt::Debug for RocksRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksRows").field("path", &self.path).field("len", &self.len).finish()
    }
}

impl RocksRows {
    /// A fresh database at `path` (anything there is removed) holding `ids` with their rows
    /// (`values`, `ids.len() × dim`), a block cache of `cache_bytes`, compacted and with the
    /// cache filled by one read of every key.
    pub(crate) fn create(
        path: &Path,
        ids: &[u64],
        values: &[f32],
        dim: usize,
        cache_bytes: usize,
    ) -> embstore_table::Result<Self> {
        let _ = std::fs::remove_dir_all(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", parent.display())))?;
        }
        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))?;
        let default = CString::new("default").expect("no NUL");
        // SAFETY: plain constructor and setter calls of the C API on objects created here;
        // the table options are copied into `options` by the factory call, and the cache and
        // filter policy are reference-counted by RocksDB (the filter policy is owned by the
        // table options from here on).
        let mut rows = unsafe {
            let options = rocksdb_options_create();
            rocksdb_options_set_create_if_missing(options, 1);
            rocksdb_options_set_compression(options, NO_COMPRESSION);
            let table = rocksdb_block_based_options_create();
            let cache = rocksdb_cache_create_lru(cache_bytes);
            rocksdb_block_based_options_set_block_cache(table, cache);
            rocksdb_block_based_options_set_filter_policy(
                table,
                rocksdb_filterpolicy_create_bloom_full(10.0),
            );
            rocksdb_options_set_block_based_table_factory(options, table);
            RocksRows {
                db: ptr::null_mut(),
                cf: ptr::null_mut(),
                options,
                table,
                cache,
                read: rocksdb_readoptions_create(),
                path: path.to_path_buf(),
                dim,
                len: ids.len(),
            }
        };
        let mut err = ptr::null_mut();
        let mut cf = ptr::null_mut();
        let names = [default.as_ptr()];
        let cf_options = [rows.options.cast_const()];
        // SAFETY: `options` is valid, `cpath`/`names` are NUL-terminated strings that outlive
        // the call, and `cf` has room for the one handle asked for.
        rows.db = unsafe {
            rocksdb_open_column_families(
                rows.options,
                cpath.as_ptr(),
                1,
                names.as_ptr(),
                cf_options.as_ptr(),
                &mut cf,
                &mut err,
            )
        };
        rows.cf = cf;
        check(err, "open")?;
        rows.load(ids, values)?;
        // Fill the block cache: every key read once.
        let mut out = vec![0f32; 4096 * dim];
        let mut found = vec![false; 4096];
        for chunk in ids.chunks(4096) {
            rows.multi_get(chunk, &mut out[..chunk.len() * dim], &mut found[..chunk.len()])?;
            if found[..chunk.len()].iter().any(|f| !f) {
                return Err(Error::new(ErrorKind::Corruption, "rocksdb: a loaded key is missing"));
            }
        }
        Ok(rows)
    }

    /// Writes the rows in batches of 1,000 without the WAL, then flushes and compacts.
    fn load(&self, ids: &[u64], values: &[f32]) -> embstore_table::Result<()> {
        let d = self.dim;
        let mut err = ptr::null_mut();
        // SAFETY: the write options and batches are created, used and destroyed here; keys and
        // values point into `ids`/`values`, which outlive each `rocksdb_writebatch_put` (the
        // batch copies them).
        unsafe {
            let w = rocksdb_writeoptions_create();
            rocksdb_writeoptions_disable_WAL(w, 1);
            for (chunk, rows) in ids.chunks(1000).zip(values.chunks(1000 * d)) {
                let batch = rocksdb_writebatch_create();
                for (k, row) in chunk.iter().zip(rows.chunks_exact(d)) {
                    let key = k.to_le_bytes();
                    rocksdb_writebatch_put(
                        batch,
                        key.as_ptr().cast(),
                        key.len(),
                        row.as_ptr().cast(),
                        std::mem::size_of_val(row),
                    );
                }
                rocksdb_write(self.db, w, batch, &mut err);
                rocksdb_writebatch_destroy(batch);
                if !err.is_null() {
                    break;
                }
            }
            rocksdb_writeoptions_destroy(w);
        }
        check(err, "write")?;
        // SAFETY: flush options created, used and destroyed here on the open database.
        unsafe {
            let f = rocksdb_flushoptions_create();
            rocksdb_flushoptions_set_wait(f, 1);
            rocksdb_flush(self.db, f, &mut err);
            rocksdb_flushoptions_destroy(f);
        }
        check(err, "flush")?;
        // SAFETY: null start and limit mean the whole key range.
        unsafe { rocksdb_compact_range(self.db, ptr::null(), 0, ptr::null(), 0) };
        Ok(())
    }

    /// One batched `MultiGet` of `ids`: rows into `out`, zeros and `false` for keys not held.
    fn multi_get(
        &self,
        ids: &[u64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> embstore_table::Result<()> {
        let n = ids.len();
        let d = self.dim;
        let keys: Vec<[u8; 8]> = ids.iter().map(|k| k.to_le_bytes()).collect();
        let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr().cast()).collect();
        let key_sizes = vec![8usize; n];
        let mut values: Vec<*mut Pinnable> = vec![ptr::null_mut(); n];
        let mut errs: Vec<*mut c_char> = vec![ptr::null_mut(); n];
        // SAFETY: every array holds `n` entries and outlives the call; the database, column
        // family and read options are open until `Drop`.
        unsafe {
            rocksdb_batched_multi_get_cf(
                self.db,
                self.read,
                self.cf,
                n,
                key_ptrs.as_ptr(),
                key_sizes.as_ptr(),
                values.as_mut_ptr(),
                errs.as_mut_ptr(),
                false,
            );
        }
        let mut result = Ok(());
        for (i, (&v, &e)) in values.iter().zip(&errs).enumerate() {
            let row = &mut out[i * d..][..d];
            found[i] = false;
            if !e.is_null() {
                if result.is_ok() {
                    result = check(e, "multi_get");
                } else {
                    // SAFETY: a malloc()ed error string we own, freed once.
                    unsafe { rocksdb_free(e.cast()) };
                }
            }
            if v.is_null() {
                row.fill(0.0);
                continue;
            }
            let mut len = 0usize;
            // SAFETY: `v` is a pinnable slice the call allocated for us; its value is `len`
            // bytes valid until it is destroyed right after the copy.
            unsafe {
                let p = rocksdb_pinnableslice_value(v, &mut len);
                if len == d * 4 {
                    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
                    for (x, b) in row.iter_mut().zip(bytes.chunks_exact(4)) {
                        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                    found[i] = true;
                } else {
                    row.fill(0.0);
                }
                rocksdb_pinnableslice_destroy(v);
            }
        }
        result
    }
}

impl embstore_server::RowSource for RocksRows {
    fn dim(&self) -> usize {
        self.dim
    }
    fn len(&self) -> usize {
        self.len
    }
    fn bytes(&self) -> u64 {
        // SAFETY: the cache is alive until `Drop`; reading its usage is thread-safe.
        unsafe { rocksdb_cache_get_usage(self.cache) as u64 }
    }
    fn may_block(&self) -> bool {
        // A read may go to the SST files on disk: off the I/O threads.
        true
    }
    fn lookup(
        &self,
        ids: &[u64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> embstore_table::Result<()> {
        self.multi_get(ids, out, found)
    }
}

impl Drop for RocksRows {
    fn drop(&mut self) {
        let mut err = ptr::null_mut();
        let cpath = CString::new(self.path.as_os_str().as_encoded_bytes()).ok();
        // SAFETY: each handle was created once in `create` and is freed once here, the column
        // family before the database, the database before the cache and options it uses.
        unsafe {
            if !self.cf.is_null() {
                rocksdb_column_family_handle_destroy(self.cf);
            }
            if !self.db.is_null() {
                rocksdb_close(self.db);
            }
            if let Some(p) = &cpath {
                rocksdb_destroy_db(self.options, p.as_ptr(), &mut err);
                if !err.is_null() {
                    rocksdb_free(err.cast());
                }
            }
            rocksdb_readoptions_destroy(self.read);
            rocksdb_block_based_options_destroy(self.table);
            rocksdb_cache_destroy(self.cache);
            rocksdb_options_destroy(self.options);
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
