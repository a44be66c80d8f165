//! A key-value store in a file on a shared file system (`file:///PATH`).
//!
//! # File format
//!
//! A 16-byte header, `"DCFSTOR2"` and a random *epoch* (`u64`, new each time the file is created or
//! reset), then appended records (`file_record`): each names its job by a digest of the job's key
//! and is signed with it, and carries a generation, an op, a key and a value. `op` is `1` (set
//! `key` to `value`) or `2` (a new generation starts; no key or value). Counters written by `add`
//! are stored as decimal text.
//!
//! # Jobs with other tokens
//!
//! Jobs with different tokens (`DC_TOKEN`, the `token` init option) may share one file: each
//! sees only the records signed with its own key, so it can neither read the other's keys nor
//! join its job (generations, members and counters are each job's own), and a record forged or
//! replayed by a writer without the token is ignored. Not secret: whoever may read the file
//! reads the values (as on the TCP store's connections), and whoever may write it can still
//! truncate it.
//!
//! Every access holds an `fcntl(F_SETLKW)` write lock on the whole file (plus an in-process mutex
//! per file, since `fcntl` locks do not exclude threads of one process, and closing any descriptor
//! of a file drops the process's locks on it). A record cut short by a crash is detected (length
//! or checksum) and truncated away by the next lock holder.
//!
//! # Generations: leftovers of earlier jobs
//!
//! Each store instance works in one *generation* and sees only that generation's records. A rank
//! registers as a *member* of the generation it joins ([`FileStore::open_job`]: a key naming its
//! job, host, pid and instance, set to `open`) and marks itself `done` ([`FileStore::job_done`])
//! once it no longer waits for the others, after success or failure. Ranks waiting in `get` touch
//! the file's mtime about once a second (a heartbeat). The rule a newcomer applies, atomically
//! under the lock:
//!
//! 1. An empty file (or a header cut short by a crash) is initialised: new epoch, generation 1.
//! 2. If the file was last written longer ago than `stale_after` (the job's timeout), it is a
//!    leftover of a long-gone job and is **reset**: truncated, new epoch, next generation. Store
//!    instances of the old epoch then fail with `DC_ERR_RENDEZVOUS` ("reset by another job")
//!    instead of reading foreign data.
//! 3. Else a new generation is started (by appending a marker; old instances keep working in
//!    theirs) when the latest generation is
//!    - *complete*: it has members and all are `done` (a finished job, or one that gave up), or
//!    - *dead*: a member still `open` ran on this host and its process is gone (a job killed
//!      during its rendezvous and restarted here), or
//!    - *silent*: a member is still `open` but the file has not been touched (no write, no
//!      heartbeat) for `min(stale_after, 15 s)` (a job killed during its rendezvous elsewhere).
//! 4. Else the newcomer joins the latest generation (its job is still gathering).
//!
//! Only the job's own records count for these rules, except the file's age (rule 2).
//!
//! A file that is not a store file is never overwritten (`DC_ERR_INVALID_ARGUMENT`); one of the
//! first format (`DCFSTOR1`, unsigned records) is reset when stale and refused while in use.

use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::rendezvous::file_record::{decode, Signer, OP_GEN, OP_SET};
use crate::rendezvous::Store;
use crate::{bail, dc_log, err};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MAGIC: [u8; 8] = *b"DCFSTOR2";
/// The first format's (records unsigned, one namespace).
const MAGIC_V1: [u8; 8] = *b"DCFSTOR1";
const HEADER_LEN: u64 = 16;
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value accepted.
pub const MAX_VALUE_LEN: usize = 64 << 20;

/// Member keys: `__dc/member/{job}/{host}/{pid}/{instance}` = `open` | `done`.
const MEMBER_PREFIX: &str = "__dc/member/";
/// A generation with open members and no sign of life for this long is abandoned (rule 3).
const SILENT_AFTER: Duration = Duration::from_secs(15);
/// How often a waiting `get` touches the file.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Distinguishes store instances of one process in member keys.
static INSTANCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether process `pid` exists on this host.
fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// What the members of a generation say about it.
#[derive(Debug, PartialEq)]
enum GenState {
    NoMembers,
    Complete,
    /// A member that is still open ran on this host in a process that is gone.
    Dead(String),
    Gathering,
}

fn gen_state(map: &HashMap<String, Vec<u8>>, host: &str) -> GenState {
    let mut any = false;
    let mut all_done = true;
    for (k, v) in map {
        let Some(m) = k.strip_prefix(MEMBER_PREFIX) else { continue };
        any = true;
        if v.as_slice() == b"done" {
            continue;
        }
        all_done = false;
        // {job}/{host}/{pid}/{instance}; the job name may itself contain '/'.
        let mut parts = m.rsplitn(4, '/');
        let (_inst, pid, mhost) = (parts.next(), parts.next(), parts.next());
        if mhost == Some(host) {
            if let Some(pid) = pid.and_then(|p| p.parse::<i32>().ok()) {
                if pid > 0 && !pid_alive(pid) {
                    return GenState::Dead(format!("pid {pid} on {host}"));
                }
            }
        }
    }
    match (any, all_done) {
        (false, _) => GenState::NoMembers,
        (true, true) => GenState::Complete,
        (true, false) => GenState::Gathering,
    }
}

/// A random 64-bit number (for the file epoch).
fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return u64::from_le_bytes(b);
    }
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
    t ^ ((std::process::id() as u64) << 32) ^ (&b as *const _ as u64)
}

/// One in-process mutex per file (device, inode).
type LockTable = HashMap<(u64, u64), Arc<Mutex<()>>>;
static PROCESS_LOCKS: Lazy<Mutex<LockTable>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Holds the whole-file `fcntl` write lock; releases it on drop.
struct FcntlLock<'a> {
    file: &'a File,
}

impl<'a> FcntlLock<'a> {
    fn acquire(file: &'a File, path: &Path) -> Result<FcntlLock<'a>> {
        loop {
            // SAFETY: a zeroed flock is a valid value; the fields we need are set below.
            let mut fl: libc::flock = unsafe { std::mem::zeroed() };
            fl.l_type = libc::F_WRLCK as _;
            fl.l_whence = libc::SEEK_SET as _;
            fl.l_start = 0;
            fl.l_len = 0; // the whole file, however long it grows
            // SAFETY: fcntl on our open descriptor with a valid flock pointer.
            let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLKW, &fl) };
            if rc == 0 {
                return Ok(FcntlLock { file });
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EDEADLK) => std::thread::sleep(Duration::from_millis(1)),
                _ => return Err(Error::system(format!("locking {}", path.display()), e)),
            }
        }
    }
}

impl Drop for FcntlLock<'_> {
    fn drop(&mut self) {
        // SAFETY: as in acquire.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_UNLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        // SAFETY: fcntl on our open descriptor with a valid flock pointer.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLK, &fl) };
    }
}

struct State {
    epoch: u64,
    gen: u32,
    /// Bytes of the file parsed so far.
    offset: u64,
    /// This generation's keys.
    map: HashMap<String, Vec<u8>>,
}

/// A [`Store`] kept in a file on a shared file system. See the module docs for the rules.
pub struct FileStore {
    path: PathBuf,
    /// The job's key: its records are the only ones this instance reads.
    signer: Signer,
    /// This instance's member key (set by `open_job`).
    member: Option<String>,
    file: Option<File>,
    plock: Arc<Mutex<()>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("path", &self.path).finish()
    }
}

/// What the parser does with records of generations other than the tracked one.
#[derive(Clone, Copy, PartialEq)]
enum Follow {
    /// Track the newest generation seen (while deciding which one to join).
    Latest,
    /// Stay in the joined generation.
    Fixed,
}

impl FileStore {
    /// Opens (creating if needed) the store file at `path` for the job of `token`. Stale means
    /// not written for the time left until `deadline`. Does not register a job; see
    /// [`FileStore::open_job`].
    pub fn open(path: impl AsRef<Path>, token: &[u8], deadline: Instant) -> Result<FileStore> {
        let stale_after = deadline.saturating_duration_since(Instant::now());
        Self::open_inner(path.as_ref(), token, stale_after, None)
    }

    /// Opens the store for the job of `token` and registers one rank of `job` (e.g. the group
    /// name) in the generation it joins; the rank must call [`FileStore::job_done`] once it stops
    /// waiting for the others. A file not written for `stale_after` is reset.
    pub fn open_job(path: impl AsRef<Path>, token: &[u8], stale_after: Duration, job: &str) -> Result<FileStore> {
        Self::open_inner(path.as_ref(), token, stale_after, Some(job))
    }

    fn open_inner(path: &Path, token: &[u8], stale_after: Duration, job: Option<&str>) -> Result<FileStore> {
        if !path.is_absolute() {
            bail!(Status::InvalidArgument, "store file {} must be an absolute path", path.display());
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::system(format!("opening store file {}", path.display()), e))?;
        let md = file.metadata().map_err(|e| Error::system(format!("stat {}", path.display()), e))?;
        let plock = lock_ignoring_poison(&PROCESS_LOCKS).entry((md.dev(), md.ino())).or_default().clone();
        let member = job.map(|j| {
            let inst = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("{MEMBER_PREFIX}{j}/{}/{}/{inst}", crate::log::hostname(), std::process::id())
        });
        let store = FileStore {
            path: path.to_path_buf(),
            signer: Signer::from_token(token),
            member,
            file: Some(file),
            plock,
            state: Mutex::new(State { epoch: 0, gen: 0, offset: 0, map: HashMap::new() }),
        };
        store.join(stale_after)?;
        Ok(store)
    }

    fn file(&self) -> &File {
        self.file.as_ref().expect("file is open until drop")
    }

    /// This instance's generation (for diagnostics and tests).
    pub fn generation(&self) -> u32 {
        lock_ignoring_poison(&self.state).gen
    }

    /// The path of the store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks this member as no longer waiting for the others (see the module docs). A no-op for
    /// instances opened without a job.
    pub fn job_done(&self) -> Result<()> {
        match &self.member {
            Some(m) => self.set(m, b"done"),
            None => Ok(()),
        }
    }

    /// Touches the file's mtime (a heartbeat while waiting).
    fn touch(&self) {
        // SAFETY: futimens on our descriptor; NULL times means "now".
        unsafe { libc::futimens(self.file().as_raw_fd(), std::ptr::null()) };
    }

    fn sys(&self, what: &str, e: std::io::Error) -> Error {
        Error::system(format!("{what} store file {}", self.path.display()), e)
    }

    /// Runs `f` with both locks held and the state refreshed from the file.
    fn locked<T>(&self, f: impl FnOnce(&Self, &mut State) -> Result<T>) -> Result<T> {
        let _p = lock_ignoring_poison(&self.plock);
        let _l = FcntlLock::acquire(self.file(), &self.path)?;
        let mut st = lock_ignoring_poison(&self.state);
        self.refresh(&mut st, Follow::Fixed)?;
        f(self, &mut st)
    }

    fn read_header(&self, size: u64) -> Result<Option<u64>> {
        if size < HEADER_LEN {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN as usize];
        self.file().read_exact_at(&mut h, 0).map_err(|e| self.sys("reading", e))?;
        if h[..8] != MAGIC {
            return Ok(None);
        }
        Ok(Some(u64::from_le_bytes(h[8..].try_into().unwrap())))
    }

    /// Reads records appended since `st.offset` (the lock is held).
    fn refresh(&self, st: &mut State, follow: Follow) -> Result<()> {
        let size = self.file().metadata().map_err(|e| self.sys("stat", e))?.len();
        match self.read_header(size)? {
            Some(epoch) if epoch == st.epoch => {}
            _ => bail!(
                Status::Rendezvous,
                "store file {} was reset by another job (it had not been written for longer than \
                 the timeout)",
                self.path.display()
            ),
        }
        if size < st.offset {
            bail!(Status::Rendezvous, "store file {} was truncated by someone else", self.path.display());
        }
        if size == st.offset {
            return Ok(());
        }
        let mut buf = vec![0u8; (size - st.offset) as usize];
        self.file().read_exact_at(&mut buf, st.offset).map_err(|e| self.sys("reading", e))?;
        let mut pos = 0usize;
        while pos < buf.len() {
            let Some((rec, len)) = decode(&buf[pos..], MAX_KEY_LEN, MAX_VALUE_LEN) else {
                let at = st.offset + pos as u64;
                dc_log!(
                    Level::Warn,
                    None,
                    "store file {}: dropping {} bytes of a record cut short at offset {at} (a crash?)",
                    self.path.display(),
                    buf.len() - pos
                );
                self.file().set_len(at).map_err(|e| self.sys("truncating", e))?;
                break;
            };
            let at = st.offset + pos as u64;
            pos += len;
            if rec.ns != self.signer.ns {
                continue; // another token's job
            }
            if !self.signer.verify(st.epoch, at, &rec) {
                dc_log!(
                    Level::Warn,
                    None,
                    "store file {}: ignoring the record at offset {at}: not signed with this job's token here (forged or replayed)",
                    self.path.display()
                );
                continue;
            }
            if rec.op == OP_GEN {
                if follow == Follow::Latest && rec.gen > st.gen {
                    st.gen = rec.gen;
                    st.map.clear();
                }
            } else if rec.gen == st.gen {
                st.map.insert(String::from_utf8_lossy(rec.key).into_owned(), rec.value.to_vec());
            }
        }
        st.offset += pos as u64;
        Ok(())
    }

    /// Appends a record at the parsed end of the file.
    fn append(&self, st: &mut State, op: u8, key: &str, value: &[u8]) -> Result<()> {
        let rec = self.signer.encode(st.epoch, st.offset, st.gen, op, key, value);
        self.file().write_all_at(&rec, st.offset).map_err(|e| self.sys("writing", e))?;
        st.offset += rec.len() as u64;
        if op == OP_SET {
            st.map.insert(key.to_string(), value.to_vec());
        }
        Ok(())
    }

    /// Starts an empty file (new epoch) with generation `gen`.
    fn reset(&self, st: &mut State, gen: u32) -> Result<()> {
        let f = self.file();
        f.set_len(0).map_err(|e| self.sys("truncating", e))?;
        st.epoch = random_u64();
        let mut h = Vec::with_capacity(HEADER_LEN as usize);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&st.epoch.to_le_bytes());
        f.write_all_at(&h, 0).map_err(|e| self.sys("writing", e))?;
        st.offset = HEADER_LEN;
        st.gen = gen;
        st.map.clear();
        self.append(st, OP_GEN, "", &[])
    }

    /// Picks (or starts) the generation to work in; see the module docs.
    fn join(&self, stale_after: Duration) -> Result<()> {
        let _p = lock_ignoring_poison(&self.plock);
        let _l = FcntlLock::acquire(self.file(), &self.path)?;
        let mut st = lock_ignoring_poison(&self.state);
        let md = self.file().metadata().map_err(|e| self.sys("stat", e))?;
        let size = md.len();
        let path = self.path.display();
        match self.read_header(size)? {
            Some(epoch) => {
                st.epoch = epoch;
                st.offset = HEADER_LEN;
                st.gen = 0;
                self.refresh(&mut st, Follow::Latest)?;
                let idle = md.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok());
                let latest = st.gen;
                let idle = idle.unwrap_or_default();
                let state = gen_state(&st.map, &crate::log::hostname());
                enum Decision {
                    Reset,
                    NewGeneration(String),
                    Join,
                }
                let decision = if idle > stale_after {
                    Decision::Reset
                } else if latest == 0 {
                    Decision::NewGeneration("no generation yet".into())
                } else {
                    match state {
                        GenState::Complete => Decision::NewGeneration(format!("generation {latest} is complete")),
                        GenState::Dead(who) => {
                            Decision::NewGeneration(format!("generation {latest} lost a member ({who} is gone)"))
                        }
                        GenState::Gathering if idle > stale_after.min(SILENT_AFTER) => {
                            Decision::NewGeneration(format!(
                                "generation {latest} has shown no sign of life for {:.0} s",
                                idle.as_secs_f64()
                            ))
                        }
                        GenState::Gathering | GenState::NoMembers => Decision::Join,
                    }
                };
                match decision {
                    Decision::Reset => {
                        dc_log!(
                            Level::Info,
                            None,
                            "store file {path}: not written for {:.0} s (> {:.0} s): a stale leftover; resetting it",
                            idle.as_secs_f64(),
                            stale_after.as_secs_f64()
                        );
                        self.reset(&mut st, latest + 1)?;
                    }
                    Decision::NewGeneration(why) => {
                        dc_log!(Level::Info, None, "store file {path}: {why}; starting generation {}", latest + 1);
                        st.gen = latest + 1;
                        st.map.clear();
                        self.append(&mut st, OP_GEN, "", &[])?;
                    }
                    Decision::Join => {
                        dc_log!(Level::Info, None, "store file {path}: joining generation {latest}");
                    }
                }
            }
            None => {
                // Empty, or a header cut short by a crash: (re)initialise. Anything else is not ours.
                let mut head = vec![0u8; size.min(HEADER_LEN) as usize];
                self.file().read_exact_at(&mut head, 0).map_err(|e| self.sys("reading", e))?;
                let ours = size < HEADER_LEN && MAGIC.starts_with(&head[..head.len().min(8)]);
                if head.starts_with(&MAGIC_V1) {
                    // Resetting it under a job still gathering there would break that job.
                    let idle = md.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).unwrap_or_default();
                    if idle <= stale_after {
                        bail!(
                            Status::Rendezvous,
                            "store file {path} is in use by a job of an older distcomm (store format 1); use another path"
                        );
                    }
                    dc_log!(Level::Info, None, "store file {path}: a stale leftover of store format 1; resetting it");
                    self.reset(&mut st, 1)?;
                } else if !ours {
                    bail!(
                        Status::InvalidArgument,
                        "{path} is not a distcomm store file (refusing to overwrite it)"
                    );
                } else {
                    dc_log!(Level::Info, None, "store file {path}: new store, generation 1");
                    self.reset(&mut st, 1)?;
                }
            }
        }
        if let Some(m) = &self.member {
            self.append(&mut st, OP_SET, m, b"open")?;
        }
        Ok(())
    }
}

fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

fn check_sizes(key: &str, value_len: usize) -> Result<()> {
    if key.len() > MAX_KEY_LEN {
        bail!(Status::InvalidArgument, "store key of {} bytes exceeds {MAX_KEY_LEN}", key.len());
    }
    if value_len > MAX_VALUE_LEN {
        bail!(Status::InvalidArgument, "store value of {value_len} bytes exceeds {MAX_VALUE_LEN}");
    }
    Ok(())
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_sizes(key, value.len())?;
        self.locked(|s, st| s.append(st, OP_SET, key, value))
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(1);
        let mut touched = Instant::now();
        loop {
            if let Some(v) = self.try_get(key)? {
                return Ok(v);
            }
            if touched.elapsed() >= HEARTBEAT {
                self.touch();
                touched = Instant::now();
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    Status::Timeout,
                    "store key {key:?} was not set within {:.1} s (file {})",
                    (now - start).as_secs_f64(),
                    self.path.display()
                );
            }
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        check_sizes(key, 0)?;
        self.locked(|_, st| Ok(st.map.get(key).cloned()))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        check_sizes(key, 0)?;
        self.locked(|s, st| {
            let cur = match st.map.get(key) {
                None => 0,
                Some(v) => parse_counter(v)
                    .ok_or_else(|| err!(Status::InvalidArgument, "store value at {key:?} is not an integer"))?,
            };
            let Some(n) = cur.checked_add(delta) else {
                bail!(Status::InvalidArgument, "store counter {key:?} overflows");
            };
            s.append(st, OP_SET, key, n.to_string().as_bytes())?;
            Ok(n)
        })
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        // Closing a descriptor drops every fcntl lock this process holds on the file, including
        // one another instance is working under: close only while no instance here holds it.
        let _p = lock_ignoring_poison(&self.plock);
        drop(self.file.take());
    }
}
