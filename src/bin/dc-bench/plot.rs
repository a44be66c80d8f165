//! A hand-written SVG plot: per op, bus bandwidth against size and time against size, both on
//! log-log axes, one series per (impl, ranks, type, redop) with in-place rows dashed. Rows that
//! repeat a (series, size) pair (rounds of compare.sh) are reduced to their median.

use crate::csv::Row;
use std::collections::BTreeMap;
use std::fmt::Write;

const PANEL_W: f64 = 520.0;
const PANEL_H: f64 = 330.0;
const MARGIN_L: f64 = 72.0;
const MARGIN_R: f64 = 18.0;
const MARGIN_T: f64 = 34.0;
const MARGIN_B: f64 = 48.0;
const LEGEND_W: f64 = 290.0;
const TITLE_H: f64 = 40.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    implementation: String,
    ranks: u64,
    dtype: String,
    redop: String,
    inplace: bool,
}

impl SeriesKey {
    /// Colors follow (impl, ranks, type, redop); the redop only where several are plotted, so
    /// an impl keeps its color across ops with and without a reduction.
    fn color_key(&self, with_redop: bool) -> (String, u64, String, String) {
        let redop = if with_redop { self.redop.clone() } else { String::new() };
        (self.implementation.clone(), self.ranks, self.dtype.clone(), redop)
    }
}

/// Per (op, series): per size, the times and bus bandwidths of every row (rounds).
type Groups = BTreeMap<(String, SeriesKey), BTreeMap<u64, (Vec<f64>, Vec<f64>)>>;

/// One plotted point: size, median time (us), median bus bandwidth (GB/s).
#[derive(Debug, Clone, Copy)]
struct Point {
    bytes: f64,
    time_us: f64,
    busbw: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub fn fmt_bytes(b: f64) -> String {
    let units = [(1u64 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (u, s) in units {
        let u = u as f64;
        if b >= u {
            let v = b / u;
            return if (v - v.round()).abs() < 1e-9 { format!("{}{s}", v.round()) } else { format!("{v:.1}{s}") };
        }
    }
    format!("{}", b.round())
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&v.abs()) {
        format!("1e{}", v.log10().round())
    } else if v >= 1.0 {
        format!("{}", (v * 1000.0).round() / 1000.0)
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A log axis mapping values in [lo, hi] onto pixels [p0, p1].
struct LogAxis {
    lo: f64,
    hi: f64,
    p0: f64,
    p1: f64,
}

impl LogAxis {
    fn map(&self, v: f64) -> f64 {
        let t = (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10());
        self.p0 + t * (self.p1 - self.p0)
    }
}

/// x: powers of two, at most about 8 labels.
fn x_ticks(lo: f64, hi: f64) -> (f64, f64, Vec<f64>) {
    let mut a = lo.log2().floor() as i32;
    let mut b = hi.log2().ceil() as i32;
    if a == b {
        a -= 1;
        b += 1;
    }
    let step = ((b - a) as f64 / 8.0).ceil().max(1.0) as i32;
    let first = a - a.rem_euclid(step);
    let ticks = (0..)
        .map(|k| first + k * step)
        .take_while(|&e| e <= b)
        .filter(|&e| e >= a)
        .map(|e| 2f64.powi(e))
        .collect();
    (2f64.powi(a), 2f64.powi(b), ticks)
}

/// y: decades, with 2 and 5 in between when the range is short.
fn y_ticks(lo: f64, hi: f64) -> (f64, f64, Vec<f64>) {
    let mut a = lo.log10().floor() as i32;
    let mut b = hi.log10().ceil() as i32;
    if a == b {
        a -= 1;
        b += 1;
    }
    let mut ticks = Vec::new();
    let step = ((b - a) as f64 / 8.0).ceil().max(1.0) as i32;
    for e in (a..=b).step_by(step as usize) {
        let d = 10f64.powi(e);
        ticks.push(d);
        if b - a <= 2 && e < b {
            ticks.push(2.0 * d);
            ticks.push(5.0 * d);
        }
    }
    (10f64.powi(a), 10f64.powi(b), ticks)
}

struct Series {
    key: SeriesKey,
    label: String,
    color: &'static str,
    points: Vec<Point>,
}

/// Renders the SVG document for `rows` (which may come from several files and impls).
pub fn render(rows: &[Row], title: &str) -> String {
    // Ops in order of first appearance; barrier (size 0) has no place on a log axis.
    let mut ops: Vec<String> = Vec::new();
    for r in rows {
        if r.bytes > 0 && r.time_us > 0.0 && !ops.contains(&r.op) {
            ops.push(r.op.clone());
        }
    }
    // Group by (op, series, bytes); medians.
    let mut groups: Groups = BTreeMap::new();
    for r in rows.iter().filter(|r| r.bytes > 0 && r.time_us > 0.0) {
        let key = SeriesKey {
            implementation: r.implementation.clone(),
            ranks: r.ranks,
            dtype: r.dtype.clone(),
            redop: r.redop.clone(),
            inplace: r.inplace,
        };
        let e = groups.entry((r.op.clone(), key)).or_default().entry(r.bytes).or_default();
        e.0.push(r.time_us);
        e.1.push(r.busbw);
    }
    // Labels name only what differs between series; colors follow (impl, ranks, type, redop).
    let keys: Vec<&SeriesKey> = groups.keys().map(|(_, k)| k).collect();
    let varies = |f: &dyn Fn(&SeriesKey) -> String| keys.iter().map(|k| f(k)).collect::<std::collections::BTreeSet<_>>().len() > 1;
    let v_ranks = varies(&|k| k.ranks.to_string());
    let v_type = varies(&|k| k.dtype.clone());
    let v_redop = keys.iter().filter(|k| k.redop != "none").map(|k| k.redop.clone()).collect::<std::collections::BTreeSet<_>>().len() > 1;
    let v_inplace = varies(&|k| k.inplace.to_string());
    let mut color_keys: Vec<(String, u64, String, String)> = keys.iter().map(|k| k.color_key(v_redop)).collect();
    color_keys.sort();
    color_keys.dedup();
    let label_of = |k: &SeriesKey| {
        let mut s = k.implementation.clone();
        if v_ranks {
            let _ = write!(s, " {}r", k.ranks);
        }
        if v_type {
            let _ = write!(s, " {}", k.dtype);
        }
        if v_redop && k.redop != "none" {
            let _ = write!(s, " {}", k.redop);
        }
        if v_inplace {
            s.push_str(if k.inplace { " in-place" } else { " out-of-place" });
        }
        s
    };

    let nrows = ops.len().max(1);
    let width = 2.0 * PANEL_W + LEGEND_W;
    let height = TITLE_H + nrows as f64 * PANEL_H;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#, PANEL_W, esc(title));
    if ops.is_empty() {
        let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">no rows to plot</text>"#, PANEL_W, TITLE_H + 40.0);
    }

    let mut legend: Vec<(String, &'static str, bool)> = Vec::new();
    for (row, op) in ops.iter().enumerate() {
        let series: Vec<Series> = groups
            .iter()
            .filter(|((o, _), _)| o == op)
            .map(|((_, k), pts)| {
                let ci = color_keys.iter().position(|c| *c == k.color_key(v_redop)).unwrap_or(0);
                Series {
                    key: k.clone(),
                    label: label_of(k),
                    color: COLORS[ci % COLORS.len()],
                    points: pts
                        .iter()
                        .map(|(&b, (t, bw))| Point { bytes: b as f64, time_us: median(t.clone()), busbw: median(bw.clone()) })
                        .collect(),
                }
            })
            .collect();
        for s in &series {
            if !legend.iter().any(|(l, _, _)| *l == s.label) {
                legend.push((s.label.clone(), s.color, s.key.inplace));
            }
        }
        let y0 = TITLE_H + row as f64 * PANEL_H;
        panel(&mut svg, &series, 0.0, y0, &format!("{op}: bus bandwidth (GB/s)"), |p| p.busbw);
        panel(&mut svg, &series, PANEL_W, y0, &format!("{op}: time (us)"), |p| p.time_us);
    }

    // Legend.
    let lx = 2.0 * PANEL_W + 10.0;
    let mut ly = TITLE_H + MARGIN_T;
    for (label, color, inplace) in &legend {
        let dash = if *inplace { r#" stroke-dasharray="6,3""# } else { "" };
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><circle cx="{}" cy="{ly}" r="3" fill="{color}"/>"#,
            lx + 28.0,
            lx + 14.0
        );
        let _ = writeln!(svg, r#"<text x="{}" y="{}">{}</text>"#, lx + 36.0, ly + 4.0, esc(label));
        ly += 18.0;
    }
    if legend.iter().any(|l| l.2) && !v_inplace {
        let _ = writeln!(svg, r##"<text x="{lx}" y="{}" fill="#555">dashed: in-place</text>"##, ly + 6.0);
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(svg: &mut String, series: &[Series], x0: f64, y0: f64, title: &str, val: impl Fn(&Point) -> f64) {
    let pts = || series.iter().flat_map(|s| s.points.iter()).filter(|p| val(p) > 0.0 && val(p).is_finite());
    let (Some(xmin), Some(xmax)) = (
        pts().map(|p| p.bytes).min_by(|a, b| a.total_cmp(b)),
        pts().map(|p| p.bytes).max_by(|a, b| a.total_cmp(b)),
    ) else {
        let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{}: no data</text>"#, x0 + PANEL_W / 2.0, y0 + PANEL_H / 2.0, esc(title));
        return;
    };
    let ymin = pts().map(&val).fold(f64::INFINITY, f64::min);
    let ymax = pts().map(&val).fold(0.0, f64::max);
    let (xlo, xhi, xt) = x_ticks(xmin, xmax);
    let (ylo, yhi, yt) = y_ticks(ymin, ymax);
    let (l, r, t, b) = (x0 + MARGIN_L, x0 + PANEL_W - MARGIN_R, y0 + MARGIN_T, y0 + PANEL_H - MARGIN_B);
    let xa = LogAxis { lo: xlo, hi: xhi, p0: l, p1: r };
    let ya = LogAxis { lo: ylo, hi: yhi, p0: b, p1: t };

    let _ = writeln!(svg, r#"<g>"#);
    let _ = writeln!(svg, r#"<text x="{}" y="{}" font-size="13" text-anchor="middle">{}</text>"#, (l + r) / 2.0, y0 + 20.0, esc(title));
    for &v in &xt {
        let x = xa.map(v);
        let _ = writeln!(svg, r##"<line x1="{x:.1}" y1="{t}" x2="{x:.1}" y2="{b}" stroke="#e4e4e4"/>"##);
        let _ = writeln!(svg, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#, b + 16.0, fmt_bytes(v));
    }
    for &v in &yt {
        let y = ya.map(v);
        let _ = writeln!(svg, r##"<line x1="{l}" y1="{y:.1}" x2="{r}" y2="{y:.1}" stroke="#e4e4e4"/>"##);
        let _ = writeln!(svg, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, l - 6.0, y + 4.0, fmt_num(v));
    }
    let _ = writeln!(svg, r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#333"/>"##, r - l, b - t);
    let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">size (bytes)</text>"#, (l + r) / 2.0, b + 36.0);
    for s in series {
        let p: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| val(p) > 0.0 && val(p).is_finite())
            .map(|p| (xa.map(p.bytes), ya.map(val(p))))
            .collect();
        if p.is_empty() {
            continue;
        }
        let dash = if s.key.inplace { r#" stroke-dasharray="6,3""# } else { "" };
        let coords: Vec<String> = p.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.8"{dash}><title>{}</title></polyline>"#,
            coords.join(" "),
            s.color,
            esc(&s.label)
        );
        for (x, y) in &p {
            let _ = writeln!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{}"/>"#, s.color);
        }
    }
    let _ = writeln!(svg, "</g>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(implementation: &str, bytes: u64, t: f64, inplace: bool) -> Row {
        Row {
            op: "allreduce".into(),
            bytes,
            count: bytes / 4,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            inplace,
            time_us: t,
            algbw: bytes as f64 / t / 1e3,
            busbw: bytes as f64 / t / 1e3,
            wrong: 0,
            ranks: 2,
            implementation: implementation.into(),
        }
    }

    #[test]
    fn renders_series_and_medians() {
        let rows = vec![
            row("distcomm", 8, 1.0, false),
            row("distcomm", 1 << 20, 100.0, false),
            row("distcomm", 1 << 20, 300.0, false),
            row("distcomm", 1 << 20, 200.0, false),
            row("distcomm", 8, 1.0, true),
            row("openmpi", 8, 2.0, false),
            row("openmpi", 1 << 20, 400.0, false),
        ];
        let svg = render(&rows, "test");
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3 * 2);
        assert!(svg.contains("openmpi"));
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.contains(">8<") && svg.contains(">4K<"), "{svg}");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn labels() {
        assert_eq!(fmt_bytes(8.0), "8");
        assert_eq!(fmt_bytes(1024.0), "1K");
        assert_eq!(fmt_bytes(64.0 * 1048576.0), "64M");
        assert_eq!(fmt_num(0.01), "0.01");
        assert_eq!(fmt_num(100.0), "100");
        assert_eq!(fmt_num(1e6), "1e6");
        let (lo, hi, t) = x_ticks(8.0, 64.0 * 1048576.0);
        assert!(lo <= 8.0 && hi >= 64.0 * 1048576.0 && t.len() <= 10, "{t:?}");
    }
}
