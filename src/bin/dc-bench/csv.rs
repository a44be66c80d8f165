//! The result rows and their CSV form, shared with bench/mpi_bench.c and bench/compare.sh:
//! `op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl`
//! (redop "none" and root -1 where they do not apply; wrong -1 when not checked).

use std::io::Write;
use std::path::Path;

pub const HEADER: &str = "op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl";

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub op: String,
    pub bytes: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub inplace: bool,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: i64,
    pub ranks: u64,
    pub implementation: String,
}

impl Row {
    pub fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{:.3},{:.6},{:.6},{},{},{}",
            self.op,
            self.bytes,
            self.count,
            self.dtype,
            self.redop,
            self.root,
            self.inplace as u8,
            self.time_us,
            self.algbw,
            self.busbw,
            self.wrong,
            self.ranks,
            self.implementation
        )
    }
}

/// Writes rows as they come, flushing each, so an interrupted run leaves what it measured.
pub struct Writer {
    out: std::io::BufWriter<std::fs::File>,
}

impl Writer {
    pub fn create(path: &Path) -> std::io::Result<Writer> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(out, "{HEADER}")?;
        out.flush()?;
        Ok(Writer { out })
    }

    pub fn row(&mut self, r: &Row) -> std::io::Result<()> {
        writeln!(self.out, "{}", r.to_csv())?;
        self.out.flush()
    }
}

/// Parses CSV text with a header line; columns are found by name (extra columns are ignored,
/// so files with more columns, like compare.sh's with a round number, read as well).
pub fn parse(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
    let Some((_, header)) = lines.next() else { return Ok(Vec::new()) };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).ok_or_else(|| format!("no column {name:?} in the header"));
    let idx = [
        col("op")?,
        col("bytes")?,
        col("count")?,
        col("type")?,
        col("redop")?,
        col("root")?,
        col("inplace")?,
        col("time_us")?,
        col("algbw")?,
        col("busbw")?,
        col("wrong")?,
        col("ranks")?,
        col("impl")?,
    ];
    let mut rows = Vec::new();
    for (no, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let get = |k: usize| f.get(idx[k]).copied().ok_or_else(|| format!("line {}: too few fields", no + 1));
        let num = |k: usize| -> Result<f64, String> {
            let v = get(k)?;
            v.parse::<f64>().map_err(|_| format!("line {}: {:?} is not a number", no + 1, v))
        };
        let int = |k: usize| -> Result<i64, String> {
            let v = get(k)?;
            v.parse::<i64>().map_err(|_| format!("line {}: {:?} is not an integer", no + 1, v))
        };
        rows.push(Row {
            op: get(0)?.to_string(),
            bytes: int(1)?.max(0) as u64,
            count: int(2)?.max(0) as u64,
            dtype: get(3)?.to_string(),
            redop: get(4)?.to_string(),
            root: int(5)?,
            inplace: int(6)? != 0,
            time_us: num(7)?,
            algbw: num(8)?,
            busbw: num(9)?,
            wrong: int(10)?,
            ranks: int(11)?.max(0) as u64,
            implementation: get(12)?.to_string(),
        });
    }
    Ok(rows)
}

pub fn read(path: &Path) -> Result<Vec<Row>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = Row {
            op: "allreduce".into(),
            bytes: 1024,
            count: 256,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            inplace: true,
            time_us: 12.5,
            algbw: 0.0819,
            busbw: 0.0819,
            wrong: 0,
            ranks: 2,
            implementation: "distcomm".into(),
        };
        let text = format!("{HEADER}\n{}\n", r.to_csv());
        assert_eq!(parse(&text).unwrap(), vec![r.clone()]);
        // Columns by name, extra ones ignored.
        let text = format!("round,{HEADER}\n3,{}\n", r.to_csv());
        assert_eq!(parse(&text).unwrap(), vec![r]);
        assert!(parse("op,bytes\nx,1\n").is_err());
    }
}
