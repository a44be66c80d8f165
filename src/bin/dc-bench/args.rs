//! Command line of dc-bench (nccl-tests' option names where they exist).

use crate::data::{Dt, Op, Redop, ALL_DTS, ALL_OPS, ALL_REDOPS};
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: dcrun -n N dc-bench [options]
       dc-bench --no-run --plot OUT.svg --compare A.csv[,B.csv...]

Measures distcomm's collectives through its C functions, in the manner of nccl-tests: a sweep of
sizes, out-of-place and in-place, every result checked. Output on rank 0.

options:
  -b, --minbytes SIZE       smallest size (default 8); suffixes K, M, G (powers of 1024)
  -e, --maxbytes SIZE       largest size (default 64M)
  -f, --stepfactor F        multiply the size by F each step (default 2)
  -i, --stepbytes SIZE      add SIZE each step instead (overrides -f)
  -o, --op LIST             allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall,
                            sendrecv, barrier, gather, scatter, allgatherv, alltoallv, or all
                            (comma-separated list; default allreduce; the v forms with every
                            count the block, block j at j * block)
  -d, --datatype LIST       int8, uint8, int32, uint32, int64, uint64, half, float, double,
                            bfloat16, or all (default float)
      --redop LIST          sum, prod, max, min, avg, band, bor, bxor, or all (default sum);
                            bitwise ops are skipped for float types
  -r, --root R              root of broadcast, reduce, gather and scatter (default 0)
  -w, --warmup_iters N      untimed iterations before timing (default 5)
  -n, --iters N             timed iterations per size (default 20)
  -c, --check N             0: no check; N > 0: after timing, N more runs per size with fresh data,
                            every element of every rank checked (default 1)
      --csv FILE            write every row as CSV (header: op,bytes,count,type,redop,root,
                            inplace,time_us,algbw,busbw,wrong,ranks,impl)
      --label NAME          the impl column of the CSV and the plot (default distcomm)
      --plot FILE.svg       draw bus bandwidth and time against size (log-log)
      --compare A.csv,...   overlay these CSV files (dc-bench's or mpi_bench's) in the plot
      --title TEXT          the plot's title
      --no-run              measure nothing: only draw --plot from the --compare files
      --overlap             instead of the ops: per size, a float sum iallreduce alone, a
                            compute loop alone on every core of the rank's share (sized to take
                            as long), and both at once; overlap efficiency = both / the longer
                            alone (1.0: perfect overlap)
  -h, --help                this text

Sizes: the total bytes of the op's data as nccl-tests counts them (allgather(v), gather: the
gathered buffer; scatter: the root's send buffer; reduce_scatter: the input; alltoall(v): one
rank's send buffer; sendrecv: bytes each rank sends), rounded down to a multiple of ranks x
type size where the op splits it into blocks.
time: the slowest rank's average per iteration. algbw = size / time; busbw = algbw x factor
(allreduce 2(n-1)/n; allgather(v), reduce_scatter, alltoall(v), gather, scatter (n-1)/n; the
others 1).
Exit status: 0, 1 on an error, 2 on a usage error, 3 if any element was wrong.
";

#[derive(Debug, Clone)]
pub struct Args {
    pub minbytes: u64,
    pub maxbytes: u64,
    pub stepfactor: u64,
    pub stepbytes: Option<u64>,
    pub ops: Vec<Op>,
    pub dtypes: Vec<Dt>,
    pub redops: Vec<Redop>,
    pub root: i32,
    pub warmup: u32,
    pub iters: u32,
    pub check: u32,
    pub csv: Option<PathBuf>,
    pub label: String,
    pub plot: Option<PathBuf>,
    pub compare: Vec<PathBuf>,
    pub title: Option<String>,
    pub no_run: bool,
    pub overlap: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            minbytes: 8,
            maxbytes: 64 << 20,
            stepfactor: 2,
            stepbytes: None,
            ops: vec![Op::Allreduce],
            dtypes: vec![Dt::Float],
            redops: vec![Redop::Sum],
            root: 0,
            warmup: 5,
            iters: 20,
            check: 1,
            csv: None,
            label: "distcomm".into(),
            plot: None,
            compare: Vec::new(),
            title: None,
            no_run: false,
            overlap: false,
        }
    }
}

pub enum Parsed {
    Help,
    Run(Box<Args>),
}

/// "8", "1K", "64M", "1G", "4KB", "2MiB" (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix("ib")).or_else(|| t.strip_suffix(['B', 'b'])).unwrap_or(t);
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size (a number with an optional K, M or G suffix)"))
}

fn list<T: Copy>(v: &str, what: &str, all: &[T], parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            out.extend_from_slice(all);
        } else {
            out.push(parse(part).ok_or_else(|| format!("unknown {what} {part:?}"))?);
        }
    }
    if out.is_empty() {
        return Err(format!("no {what} given"));
    }
    Ok(out)
}

fn dedup<T: PartialEq + Copy>(v: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

pub fn parse(argv: Vec<String>) -> Result<Parsed, String> {
    let mut a = Args::default();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it.next().ok_or_else(|| format!("{name} needs a value")),
            }
        };
        let num = |v: String, name: &str| -> Result<u32, String> {
            v.parse::<u32>().map_err(|_| format!("{name}: {v:?} is not a non-negative integer"))
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "-b" | "--minbytes" => a.minbytes = parse_size(&value()?)?,
            "-e" | "--maxbytes" => a.maxbytes = parse_size(&value()?)?,
            "-f" | "--stepfactor" => {
                let v = value()?;
                a.stepfactor = v.parse::<u64>().ok().filter(|&f| f >= 2).ok_or(format!("{name}: {v:?} is not an integer >= 2"))?;
            }
            "-i" | "--stepbytes" => a.stepbytes = Some(parse_size(&value()?)?).filter(|&s| s > 0),
            "-o" | "--op" => a.ops = dedup(list(&value()?, "op", &ALL_OPS, Op::parse)?),
            "-d" | "--datatype" => a.dtypes = dedup(list(&value()?, "datatype", &ALL_DTS, Dt::parse)?),
            "--redop" => a.redops = dedup(list(&value()?, "redop", &ALL_REDOPS, Redop::parse)?),
            "-r" | "--root" => {
                let v = value()?;
                a.root = v.parse::<i32>().ok().filter(|&r| r >= 0).ok_or(format!("{name}: {v:?} is not a rank"))?;
            }
            "-w" | "--warmup_iters" | "--warmup-iters" => a.warmup = num(value()?, &name)?,
            "-n" | "--iters" => a.iters = num(value()?, &name)?.max(1),
            "-c" | "--check" => a.check = num(value()?, &name)?,
            "--csv" => a.csv = Some(value()?.into()),
            "--label" => a.label = value()?,
            "--plot" => a.plot = Some(value()?.into()),
            "--compare" => a.compare.extend(value()?.split(',').filter(|s| !s.is_empty()).map(PathBuf::from)),
            "--title" => a.title = Some(value()?),
            "--no-run" => a.no_run = true,
            "--overlap" => a.overlap = true,
            _ => return Err(format!("unknown option {arg:?}")),
        }
    }
    if a.minbytes > a.maxbytes {
        return Err(format!("--minbytes {} is larger than --maxbytes {}", a.minbytes, a.maxbytes));
    }
    if a.label.is_empty() || a.label.contains([',', '"', '\n']) {
        return Err("--label must be non-empty, without commas or quotes".into());
    }
    if a.no_run && a.plot.is_none() {
        return Err("--no-run only draws a plot: give --plot FILE.svg and --compare".into());
    }
    Ok(Parsed::Run(Box::new(a)))
}

impl Args {
    /// The sweep: minbytes, then times stepfactor (or plus stepbytes) while <= maxbytes.
    pub fn sizes(&self) -> Vec<u64> {
        let mut v = Vec::new();
        let mut s = self.minbytes;
        loop {
            v.push(s);
            let next = match self.stepbytes {
                Some(step) => s.checked_add(step),
                None => s.max(1).checked_mul(self.stepfactor),
            };
            match next {
                Some(n) if n <= self.maxbytes && n > s => s = n,
                _ => break,
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        match parse(s.split_whitespace().map(String::from).collect()).unwrap() {
            Parsed::Run(a) => *a,
            Parsed::Help => panic!("help"),
        }
    }

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("4KB").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn sweep() {
        assert_eq!(args("-b 8 -e 64 -f 2").sizes(), vec![8, 16, 32, 64]);
        assert_eq!(args("-b 8 -e 100 -f 4").sizes(), vec![8, 32]);
        assert_eq!(args("-b 1K -e 3K -i 1K").sizes(), vec![1024, 2048, 3072]);
        assert_eq!(args("-b 0 -e 4 -f 2").sizes(), vec![0, 2, 4]);
        assert_eq!(args("--minbytes=1M --maxbytes=1M").sizes(), vec![1 << 20]);
    }

    #[test]
    fn lists() {
        let a = args("-o all -d float,half --redop sum,max");
        assert_eq!(a.ops.len(), 12);
        assert_eq!(a.dtypes, vec![Dt::Float, Dt::Half]);
        assert_eq!(a.redops, vec![Redop::Sum, Redop::Max]);
        assert!(parse(vec!["-o".into(), "nope".into()]).is_err());
        assert!(parse(vec!["-b".into(), "2M".into(), "-e".into(), "1M".into()]).is_err());
    }
}
