//! `dcrun`: starts the ranks of a distcomm job on this host, serving their rendezvous store.
//! See `dcrun --help`.

mod placement;

use distcomm::rendezvous::config::parse_host_port;
use distcomm::auth::hex;
use distcomm::rendezvous::tcp_store::fmt_host_port;
use distcomm::rendezvous::StoreServer;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: dcrun -n N [options] [--] PROG [ARGS...]

Starts N ranks of PROG on this host with the environment distcomm's env:// init reads, and serves
their rendezvous store.

options:
  -n, --nproc N           ranks on this node (required)
      --nnodes K          nodes in the job (default 1); start one dcrun per node
      --node-rank I       this node's index in 0..K (default 0)
      --master HOST:PORT  the store's address; node 0 serves it there (exactly that address).
                          Required with --nnodes > 1. Default: 127.0.0.1 and a free port.
      --rank0-store       do not serve the store: rank 0 serves it at MASTER_PORT, as under
                          torchrun. For programs whose own rendezvous takes MASTER_PORT, such as
                          torch.distributed's env:// (with distcomm.torch's backend distcomm).
                          DC_LAUNCHER_STORE is not set; the port is --master's, else a free one
      --no-prefix         do not prefix output lines with [RANK]
      --keep-going        a rank that fails does not stop the others (for programs that go on
                          without a failed rank, e.g. under MPI_ERRORS_RETURN); dcrun still
                          exits with the first failed rank's status once every rank has ended
      --time-limit S      stop the ranks (SIGTERM, then SIGKILL) once the job has run S seconds
                          and exit with status 124 (0: no limit, the default; mpiexec passes
                          MPIEXEC_TIMEOUT as this, as MPICH's mpiexec honours it)
      --bind MODE         auto (default): cores when the ranks are no more than the cores dcrun
                          may use; more ranks than cores are bound round robin while nothing
                          else runs on the host and unbound while other work does (dcrun
                          looks every 100 ms: bound, a busy process's core traps them);
                          cores: give each rank its own equal share of the cores (keeps ranks
                          that talk through shared memory off one core), and with more ranks
                          than cores bind them round robin (rank i to core i mod cores);
                          none: leave placement to the scheduler
  -h, --help              this text
  -V, --version           the version

Each rank gets MASTER_ADDR, MASTER_PORT, RANK (= node_rank * N + local rank), WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, DC_LAUNCHER_STORE=1 (the store is dcrun's, so rank 0
is a plain client; not with --rank0-store) and DC_TOKEN (a fresh random one, unless DC_TOKEN is already set).
With --nnodes > 1 every node must use the same token: export the same DC_TOKEN on every node
before starting dcrun (for example DC_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'));
dcrun refuses to start without it. Ranks' stdin is /dev/null.

Each rank's stdout and stderr lines are prefixed with [RANK]. SIGINT and SIGTERM are forwarded to
every rank (a second one kills them). When a rank exits with a non-zero status or is killed by a
signal, the others get SIGTERM, then SIGKILL after 3 s (not with --keep-going), and dcrun exits with that rank's status
(128 + signal number for a signal). dcrun exits 0 when every rank exits 0, 2 on a usage error.
";

/// The cores each of `n` local ranks gets, from the cores dcrun may use: with at least as many
/// cores as ranks, an equal share each; with fewer, one core each, round robin (rank i on core
/// i mod cores), so every core carries the same number of ranks and neighbouring ranks, which
/// exchange the most in rings and pipelines, run on different cores side by side instead of
/// taking turns on one. Left to the scheduler, two neighbours often start on one core and stay
/// there (measured: 4 ranks on 2 cores, ring exchange of 16 B: 1.5-1.8 us per step round robin,
/// 1.9-2.4 us unbound or with neighbours paired).
fn share_cpus(cpus: &[usize], n: usize) -> Vec<Vec<usize>> {
    if cpus.len() < n {
        return (0..n).map(|i| vec![cpus[i % cpus.len()]]).collect();
    }
    let per = cpus.len() / n;
    (0..n).map(|i| cpus[i * per..(i + 1) * per].to_vec()).collect()
}

/// Where dcrun puts the ranks of its host (`--bind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bind {
    /// `Cores` when the ranks are no more than the cores; more ranks than cores are bound
    /// round robin while nothing else runs on the host and left to the scheduler while other
    /// work does (see placement.rs).
    Auto,
    Cores,
    None,
}

/// How the ranks of a host are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Bound,
    /// Bound while the host is otherwise quiet (placement.rs).
    Adaptive,
    Free,
}

impl Bind {
    /// How `n` ranks on a host where dcrun may use `cores` cores are placed.
    fn place(self, n: usize, cores: usize) -> Place {
        match self {
            Bind::Auto if n > cores => Place::Adaptive,
            Bind::Auto | Bind::Cores => Place::Bound,
            Bind::None => Place::Free,
        }
    }
}

/// The ranks' placement: how, each rank's share of the cores dcrun may use (`share_cpus`) as an
/// affinity mask, and all of them. None where the mask cannot be read or nothing is bound.
fn core_shares(n: usize, bind: Bind) -> Option<(Place, Vec<libc::cpu_set_t>, libc::cpu_set_t)> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let mut all: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut all) } != 0 {
        return None;
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &all) }).collect();
    let place = bind.place(n, cpus.len());
    if n == 0 || cpus.is_empty() || place == Place::Free {
        return None;
    }
    let shares = share_cpus(&cpus, n)
        .iter()
        .map(|share| {
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &c in share {
                unsafe { libc::CPU_SET(c, &mut set) };
            }
            set
        })
        .collect();
    Some((place, shares, all))
}

/// How long ranks get between SIGTERM and SIGKILL when the job is torn down.
const GRACE: Duration = Duration::from_secs(3);

#[derive(Debug)]
struct Args {
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master: Option<(String, u16)>,
    prefix: bool,
    bind: Bind,
    /// --rank0-store: rank 0 serves the store (torchrun's way), not dcrun.
    rank0_store: bool,
    /// --keep-going: a failed rank does not stop the others (fault-tolerant programs).
    keep_going: bool,
    /// --time-limit: the ranks are stopped once the job has run this long.
    time_limit: Option<Duration>,
    prog: Vec<OsString>,
}

enum Action {
    Help,
    Version,
    Run(Args),
}

fn parse_args(argv: Vec<OsString>) -> Result<Action, String> {
    let mut nproc = None;
    let mut nnodes = 1usize;
    let mut node_rank = 0usize;
    let mut master = None;
    let mut prefix = true;
    let mut bind = Bind::Auto;
    let mut rank0_store = false;
    let mut keep_going = false;
    let mut time_limit = None;
    let mut it = argv.into_iter().peekable();
    let mut prog = Vec::new();

    fn number(name: &str, v: Option<String>) -> Result<usize, String> {
        let v = v.ok_or_else(|| format!("{name} needs a value"))?;
        v.parse::<usize>().map_err(|_| format!("{name}: {v:?} is not a non-negative integer"))
    }

    while let Some(arg) = it.next() {
        let Some(s) = arg.to_str().map(str::to_string) else {
            prog.push(arg);
            break;
        };
        if s == "--" {
            break;
        }
        if !s.starts_with('-') || s == "-" {
            prog.push(arg);
            break;
        }
        // --opt=value and -nVALUE forms.
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ if s.starts_with("-n") && s.len() > 2 && !s.starts_with("--") => ("-n".to_string(), Some(s[2..].to_string())),
            _ => (s.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            match it.next() {
                Some(v) => v.into_string().map_err(|_| format!("{name}: the value is not UTF-8")),
                None => Err(format!("{name} needs a value")),
            }
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(Action::Help),
            "-V" | "--version" => return Ok(Action::Version),
            "-n" | "--nproc" | "--nproc-per-node" | "--nproc_per_node" => {
                nproc = Some(number(&name, Some(value(&name)?))?)
            }
            "--nnodes" => nnodes = number(&name, Some(value(&name)?))?,
            "--node-rank" | "--node_rank" => node_rank = number(&name, Some(value(&name)?))?,
            "--master" | "--master-addr" => {
                let v = value(&name)?;
                master = Some(parse_host_port(&v, "--master").map_err(|e| e.msg)?);
            }
            "--no-prefix" => prefix = false,
            "--rank0-store" => rank0_store = true,
            "--keep-going" => keep_going = true,
            "--time-limit" => {
                let secs = number(&name, Some(value(&name)?))?;
                time_limit = (secs > 0).then(|| Duration::from_secs(secs as u64));
            }
            "--bind" | "--bind-to" => {
                bind = match value(&name)?.as_str() {
                    "auto" => Bind::Auto,
                    "cores" | "core" => Bind::Cores,
                    "none" => Bind::None,
                    other => return Err(format!("--bind: unknown mode {other} (auto, cores or none)")),
                }
            }
            _ => return Err(format!("unknown option {s}")),
        }
    }
    prog.extend(it);
    let Some(nproc) = nproc else { return Err("-n N is required".into()) };
    if nproc < 1 {
        return Err("-n must be at least 1".into());
    }
    if nnodes < 1 {
        return Err("--nnodes must be at least 1".into());
    }
    if node_rank >= nnodes {
        return Err(format!("--node-rank {node_rank} is not below --nnodes {nnodes}"));
    }
    if nnodes > 1 && master.is_none() {
        return Err("--nnodes > 1 needs --master HOST:PORT (node 0's address)".into());
    }
    if prog.is_empty() {
        return Err("no program given".into());
    }
    Ok(Action::Run(Args { nproc, nnodes, node_rank, master, prefix, bind, rank0_store, keep_going, time_limit, prog }))
}

fn main() {
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    match parse_args(argv) {
        Ok(Action::Help) => {
            print!("{USAGE}");
        }
        Ok(Action::Version) => {
            println!("dcrun (distcomm) {}", env!("CARGO_PKG_VERSION"));
        }
        Ok(Action::Run(args)) => std::process::exit(run(args)),
        Err(msg) => {
            eprintln!("dcrun: {msg}\n\n{USAGE}");
            std::process::exit(2);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Signals: the handler writes the signal number into a pipe the main loop polls.
// ---------------------------------------------------------------------------------------------

static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = WAKE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; b lives for the call. errno is saved and restored.
        unsafe {
            let saved = *libc::__errno_location();
            libc::write(fd, &b as *const u8 as *const libc::c_void, 1);
            *libc::__errno_location() = saved;
        }
    }
}

/// Returns the read end of the wake pipe.
fn install_signal_handlers() -> std::io::Result<libc::c_int> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    WAKE_FD.store(fds[1], Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with our handler and an empty mask is valid.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(fds[0])
}

fn signal_name(sig: i32) -> String {
    let n = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    format!("signal {sig} ({n})")
}

// ---------------------------------------------------------------------------------------------
// Running the job
// ---------------------------------------------------------------------------------------------

/// A fresh random token: 16 bytes from /dev/urandom, in hex.
fn random_token() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(hex(&b))
}

/// A port that is free on 127.0.0.1 now, for rank 0 to bind (as torchrun finds one: a short
/// window in which another process could take it).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Serves the store on exactly `host:port`.
fn serve_store(host: &str, port: u16, token: &[u8]) -> Result<StoreServer, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve --master host {host}: {e}"))?
        .collect();
    let mut last = format!("{host} resolves to no address");
    for a in addrs {
        match StoreServer::start(a, token.to_vec()) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.msg,
        }
    }
    Err(format!("cannot serve the store on {}: {last}", fmt_host_port(host, port)))
}

/// Copies a child's pipe to ours line by line, each line prefixed with `[rank] `.
fn pump(src: impl Read, rank: usize, to_stderr: bool, done: mpsc::Sender<()>) {
    let mut r = BufReader::new(src);
    let tag = format!("[{rank}] ");
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        let mut out = Vec::with_capacity(tag.len() + line.len());
        out.extend_from_slice(tag.as_bytes());
        out.extend_from_slice(&line);
        // Errors (a closed stdout) are ignored: keep draining so the rank never blocks on us.
        if to_stderr {
            let _ = std::io::stderr().lock().write_all(&out);
        } else {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(&out);
            let _ = o.flush();
        }
    }
    let _ = done.send(());
}

/// Decodes a wait status: (exit code dcrun should use, description), or None for success.
fn failure(status: libc::c_int) -> Option<(i32, String)> {
    if libc::WIFEXITED(status) {
        let code = libc::WEXITSTATUS(status);
        if code == 0 {
            None
        } else {
            Some((code, format!("exited with status {code}")))
        }
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        Some((128 + sig, format!("was killed by {}", signal_name(sig))))
    } else {
        None
    }
}

fn signal_all(alive: &HashMap<libc::pid_t, usize>, sig: libc::c_int) {
    for &pid in alive.keys() {
        // Each rank leads its own process group: signal the group, so helpers it started go too.
        // SAFETY: kill(2) with a negative pid signals that process group; harmless if gone.
        unsafe {
            if libc::kill(-pid, sig) != 0 {
                libc::kill(pid, sig);
            }
        }
    }
}

fn run(args: Args) -> i32 {
    let token = match std::env::var("DC_TOKEN") {
        Ok(t) if !t.is_empty() => t,
        _ if args.nnodes > 1 => {
            eprintln!(
                "dcrun: --nnodes {} needs the same DC_TOKEN on every node; export one on every node \
                 before starting dcrun, e.g.\n  export DC_TOKEN=<the same random string everywhere> \
                 (generate one with: od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')",
                args.nnodes
            );
            return 2;
        }
        _ => match random_token() {
            Ok(t) => t,
            Err(e) => {
                eprintln!("dcrun: cannot read /dev/urandom for a token: {e}");
                return 1;
            }
        },
    };

    // The store: node 0 serves it for the whole job (or, with --rank0-store, rank 0 does).
    let (server, master_host, master_port) = match (&args.master, args.node_rank) {
        (Some((h, p)), _) if args.rank0_store => (None, h.clone(), *p),
        (None, _) if args.rank0_store => match free_port() {
            Ok(p) => (None, "127.0.0.1".to_string(), p),
            Err(e) => {
                eprintln!("dcrun: cannot find a free port for rank 0's store: {e}");
                return 1;
            }
        },
        (Some((h, p)), 0) => match serve_store(h, *p, token.as_bytes()) {
            Ok(s) => (Some(s), h.clone(), *p),
            Err(e) => {
                eprintln!("dcrun: {e}");
                return 1;
            }
        },
        (Some((h, p)), _) => (None, h.clone(), *p),
        (None, _) => match StoreServer::start("127.0.0.1:0".parse().unwrap(), token.as_bytes().to_vec()) {
            Ok(s) => {
                let p = s.local_addr().port();
                (Some(s), "127.0.0.1".to_string(), p)
            }
            Err(e) => {
                eprintln!("dcrun: cannot start the store: {}", e.msg);
                return 1;
            }
        },
    };

    let wake = match install_signal_handlers() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("dcrun: cannot install signal handlers: {e}");
            return 1;
        }
    };

    let world = args.nproc * args.nnodes;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = 0usize;
    let mut alive: HashMap<libc::pid_t, usize> = HashMap::new();
    let mut spawn_error: Option<(i32, String)> = None;
    let mut pids: Vec<libc::pid_t> = Vec::new();

    let placement = core_shares(args.nproc, args.bind);
    // More ranks than cores start bound only if the host is quiet now (a look of 50 ms).
    let start_bound = match &placement {
        Some((Place::Adaptive, ..)) => !placement::host_busy_now(Duration::from_millis(50)),
        Some(_) => true,
        None => false,
    };
    let shares = placement.as_ref().filter(|_| start_bound).map(|(_, s, _)| s.clone());
    let host_cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for local in 0..args.nproc {
        let rank = args.node_rank * args.nproc + local;
        let mut cmd = Command::new(&args.prog[0]);
        if let Some(shares) = &shares {
            let mask = shares[local];
            // SAFETY: only sched_setaffinity, async-signal-safe, runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mask);
                    Ok(())
                });
            }
        }
        cmd.args(&args.prog[1..])
            .env("MASTER_ADDR", &master_host)
            .env("MASTER_PORT", master_port.to_string())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            // The cores we may use, as we see them before binding the ranks to their shares:
            // a bound rank sees only its share and would think it is crowded.
            .env("DC_LOCAL_CORES", host_cores.to_string())
            .env("NODE_RANK", args.node_rank.to_string())
            .env("DC_TOKEN", &token)
            .stdin(Stdio::null())
            .process_group(0);
        if !args.rank0_store {
            cmd.env("DC_LAUNCHER_STORE", "1");
        }
        if args.prefix {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        match cmd.spawn() {
            Ok(mut child) => {
                alive.insert(child.id() as libc::pid_t, rank);
                pids.push(child.id() as libc::pid_t);
                for (pipe, to_stderr) in [
                    (child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>), false),
                    (child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>), true),
                ] {
                    if let Some(p) = pipe {
                        let tx = done_tx.clone();
                        if std::thread::Builder::new()
                            .name(format!("dcrun-pump-{rank}"))
                            .spawn(move || pump(p, rank, to_stderr, tx))
                            .is_ok()
                        {
                            pumps += 1;
                        }
                    }
                }
                // `child` is dropped without waiting; we reap with waitpid below.
            }
            Err(e) => {
                let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
                eprintln!("dcrun: cannot start rank {rank} ({}): {e}", args.prog[0].to_string_lossy());
                spawn_error = Some((code, e.to_string()));
                break;
            }
        }
    }
    drop(done_tx);
    let stop_watch = Arc::new(AtomicBool::new(false));
    if let (Some((Place::Adaptive, shares, all)), None) = (placement, &spawn_error) {
        let stop = stop_watch.clone();
        let _ = std::thread::Builder::new().name("dcrun-placement".into()).spawn(move || placement::watch(pids, shares, all, start_bound, stop));
    }

    let mut result: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut time_up_at = args.time_limit.map(|d| Instant::now() + d);
    let mut user_signals = 0u32;
    let mut last_user_signal = 0i32;
    if let Some((code, _)) = spawn_error {
        result = Some(code);
        signal_all(&alive, libc::SIGTERM);
        kill_at = Some(Instant::now() + GRACE);
    }

    while !alive.is_empty() {
        // Reap everything that has exited.
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid with a valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            let Some(rank) = alive.remove(&pid) else { continue };
            if let Some((code, what)) = failure(status) {
                if result.is_none() {
                    result = Some(code);
                    if alive.is_empty() {
                        eprintln!("dcrun: rank {rank} (pid {pid}) {what}");
                    } else if args.keep_going {
                        eprintln!("dcrun: rank {rank} (pid {pid}) {what}; the others go on (--keep-going)");
                    } else {
                        eprintln!("dcrun: rank {rank} (pid {pid}) {what}; stopping the other ranks");
                        // Ranks that were just sent the user's signal are stopping already: a
                        // second SIGTERM would run their handlers twice.
                        if user_signals == 0 {
                            signal_all(&alive, libc::SIGTERM);
                        }
                        kill_at = Some(Instant::now() + GRACE);
                    }
                }
            }
        }
        if alive.is_empty() {
            break;
        }
        if time_up_at.is_some_and(|t| Instant::now() >= t) {
            time_up_at = None;
            eprintln!("dcrun: the job ran past its time limit of {} s (--time-limit); stopping the ranks", args.time_limit.unwrap_or_default().as_secs());
            result.get_or_insert(124);
            signal_all(&alive, libc::SIGTERM);
            kill_at = Some(Instant::now() + GRACE);
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            signal_all(&alive, libc::SIGKILL);
            kill_at = None;
        }
        let timeout_ms = match kill_at.into_iter().chain(time_up_at).min() {
            Some(t) => t.saturating_duration_since(Instant::now()).as_millis().clamp(1, 1000) as libc::c_int,
            None => 1000,
        };
        let mut pfd = libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: reading into a valid buffer from our non-blocking pipe.
            let n = unsafe { libc::read(wake, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
            if n <= 0 {
                break;
            }
            for &sig in &buf[..n as usize] {
                let sig = sig as i32;
                if sig == libc::SIGCHLD {
                    continue;
                }
                user_signals += 1;
                last_user_signal = sig;
                if user_signals == 1 {
                    eprintln!("dcrun: got {}; forwarding it to the ranks", signal_name(sig));
                    signal_all(&alive, sig);
                } else {
                    eprintln!("dcrun: got {} again; killing the ranks", signal_name(sig));
                    signal_all(&alive, libc::SIGKILL);
                }
            }
        }
    }

    stop_watch.store(true, Ordering::Relaxed);
    // Let the output pumps drain (briefly: a rank's leftover helper may keep a pipe open).
    let drain_until = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        let left = drain_until.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    let _ = std::io::stdout().flush();
    drop(server);
    match result {
        Some(code) => code,
        None if user_signals > 0 => 128 + last_user_signal,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::share_cpus;

    #[test]
    fn by_default_more_ranks_than_cores_are_placed_by_the_hosts_load() {
        use super::{Bind, Place};
        assert!(Bind::Auto.place(2, 2) == Place::Bound && Bind::Auto.place(1, 4) == Place::Bound);
        assert_eq!(Bind::Auto.place(3, 2), Place::Adaptive, "more ranks than cores: bound while the host is quiet");
        assert_eq!(Bind::Cores.place(8, 2), Place::Bound, "asked for: round robin");
        assert_eq!(Bind::None.place(1, 2), Place::Free);
    }

    #[test]
    fn ranks_share_the_cores_equally_or_round_robin() {
        assert_eq!(share_cpus(&[0, 1, 2, 3], 2), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(share_cpus(&[0, 1, 2], 2), vec![vec![0], vec![1]], "a core left over stays unused");
        assert_eq!(share_cpus(&[4, 6], 4), vec![vec![4], vec![6], vec![4], vec![6]], "neighbours on different cores");
        assert_eq!(share_cpus(&[0, 1], 5).iter().filter(|s| s[0] == 0).count(), 3);
    }
}
