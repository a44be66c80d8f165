//! `DC_DEBUG=WARN|INFO|TRACE` logging to stderr, like `NCCL_DEBUG`. Each line is prefixed with
//! host, pid and (when known) rank: `myhost:1234:r3 distcomm INFO ...`.

use once_cell::sync::Lazy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Off = 0,
    Warn = 1,
    Info = 2,
    Trace = 3,
}

impl Level {
    /// Parses a `DC_DEBUG` value (case-insensitive). Unknown values mean `Warn` (`DETAIL`, used
    /// by the mismatch checker, implies `Info`).
    pub fn parse(v: &str) -> Level {
        match v.trim().to_ascii_uppercase().as_str() {
            "" | "OFF" | "NONE" | "0" => Level::Off,
            "INFO" | "DETAIL" => Level::Info,
            "TRACE" | "ALL" => Level::Trace,
            _ => Level::Warn,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Off => "OFF",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Trace => "TRACE",
        }
    }
}

static LEVEL: Lazy<Level> =
    Lazy::new(|| crate::params::get().debug.as_deref().map(Level::parse).unwrap_or(Level::Off));

static HOST: Lazy<String> = Lazy::new(hostname);

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

pub fn enabled(level: Level) -> bool {
    level != Level::Off && *LEVEL >= level
}

/// Writes one log line (use the `dc_log!` macro).
pub fn write(level: Level, rank: Option<usize>, msg: std::fmt::Arguments<'_>) {
    let rank = rank.map(|r| format!(":r{r}")).unwrap_or_default();
    // One write for the whole line: `eprintln!` writes each piece on its own, and the lines of
    // ranks sharing a terminal or pipe interleave piece by piece (a pipe keeps writes of up to
    // 4 KiB whole).
    let line = format!("{}:{}{} distcomm {} {}\n", *HOST, std::process::id(), rank, level.name(), msg);
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs a failed call at WARN.
pub fn debug_error(call: &str, e: &crate::error::Error) {
    if enabled(Level::Warn) {
        write(Level::Warn, None, format_args!("{call} failed: {e}"));
    }
}

/// `dc_log!(Level::Info, Some(rank), "fmt", args)`.
#[macro_export]
macro_rules! dc_log {
    ($level:expr, $rank:expr, $($fmt:tt)+) => {
        if $crate::log::enabled($level) {
            $crate::log::write($level, $rank, format_args!($($fmt)+));
        }
    };
}
