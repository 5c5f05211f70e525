//! PNG plots (plotters, bitmap backend, text with the DejaVu Sans font loaded at run time).
//!
//! - `<suite>-ratio.png`: nasd ÷ each peer and nasd ÷ local per job;
//! - `<suite>-sweep-<group>.png`: the headline figure and p50/p99 latency against iodepth,
//!   read share or client count, one line per target (IOPS = concurrency / latency);
//! - `metadata-values.png`: operations per second per target;
//! - `iozone-<op>-<target>.png`: 3D surface of MiB/s over file size × record size.

use super::report::ratio;
use super::suites::{JobKind, Metric, IOZONE_OPS};
use super::{fio::fmt_size, JobResult, Results};
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FONT: &str = "sans-serif";

static FONT_LOADED: OnceLock<Result<(), String>> = OnceLock::new();

/// Register DejaVu Sans for plot text (once).
pub fn load_font() -> Result<()> {
    FONT_LOADED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT_PATH).map_err(|e| {
                format!("plot font {FONT_PATH}: {e}: install the Debian package fonts-dejavu-core (apt-get install fonts-dejavu-core)")
            })?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| format!("{FONT_PATH} is not a usable TrueType font (package fonts-dejavu-core)"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn color_of(r: &Results, target: &str) -> RGBColor {
    let i = r.targets.iter().position(|t| t.name == target).unwrap_or(0);
    COLORS[i % COLORS.len()]
}

type DResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Draws the chart's legend at `at`, in a bordered, nearly opaque white box.
fn draw_legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>, at: SeriesLabelPosition, font_size: i32) -> DResult<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, font_size))
        .draw()?;
    Ok(())
}

fn e2a(e: Box<dyn std::error::Error>) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// Draw every plot for the results into `dir`; returns (file name, caption).
pub fn all(r: &Results, dir: &Path) -> Result<Vec<(String, String)>> {
    load_font()?;
    let mut out = Vec::new();
    let mut suites: Vec<String> = Vec::new();
    for j in &r.jobs {
        if !suites.contains(&j.job.suite) {
            suites.push(j.job.suite.clone());
        }
    }
    for suite in &suites {
        let jobs: Vec<&JobResult> = r.jobs.iter().filter(|j| &j.job.suite == suite).collect();
        if suite == "iozone" {
            for op in IOZONE_OPS {
                for t in r.target_names() {
                    let file = format!("iozone-{op}-{t}.png");
                    if iozone_surface(r, &jobs, op, &t, &dir.join(&file)).map_err(e2a)? {
                        out.push((file, format!("iozone {op} on {t}: MiB/s over file size × record size")));
                    }
                }
            }
        }
        if r.has("nasd") && r.targets.len() > 1 && suite != "iozone" {
            let file = format!("{suite}-ratio.png");
            ratio_bars(r, &jobs, suite, &dir.join(&file)).map_err(e2a)?;
            out.push((file, format!("{suite}: nasd ÷ peer and nasd ÷ local per job")));
        }
        if suite == "metadata" {
            let file = format!("{suite}-values.png");
            value_bars(r, &jobs, &dir.join(&file)).map_err(e2a)?;
            out.push((file, "metadata: operations per second".into()));
        }
        let mut groups: Vec<String> = Vec::new();
        for j in &jobs {
            if !groups.contains(&j.job.group) && !matches!(j.job.kind, JobKind::Meta { .. } | JobKind::Iozone { .. }) {
                groups.push(j.job.group.clone());
            }
        }
        for g in groups {
            let gj: Vec<&JobResult> = jobs.iter().copied().filter(|j| j.job.group == g).collect();
            let xs: std::collections::BTreeSet<u64> = gj.iter().map(|j| j.job.x as u64).collect();
            if xs.len() < 2 {
                continue;
            }
            let file = format!("{suite}-sweep-{}.png", super::slug(&g));
            let xlabel = match gj[0].job.kind {
                JobKind::Scale { .. } => "concurrent clients (separate fio processes)",
                _ if suite == "mix" => "reads in the mix (%)",
                _ => "iodepth (I/Os in flight)",
            };
            sweep(r, &gj, &g, xlabel, suite != "mix", &dir.join(&file)).map_err(e2a)?;
            out.push((file, format!("{suite}: {g}, throughput and latency against {xlabel}")));
        }
    }
    Ok(out)
}

fn ratio_bars(r: &Results, jobs: &[&JobResult], suite: &str, path: &Path) -> DResult<()> {
    let mut others: Vec<String> = r.peers();
    if r.has("local") {
        others.push("local".into());
    }
    let series: Vec<BarSeries> = others
        .iter()
        .map(|o| BarSeries {
            label: format!("nasd ÷ {o}"),
            color: color_of(r, o),
            values: jobs.iter().map(|j| ratio(j.value("nasd"), j.value(o))).collect(),
        })
        .collect();
    let caption = format!("{suite}: nasd ÷ peer (higher = nasd faster)");
    // Ratios centre on 1 (equal), which must be on the scale and is marked.
    log_bars(jobs, &series, &caption, "ratio nasd ÷ target (log scale; 1 = equal)", (1.0, 1.5), Some(1.0), path)
}

fn value_bars(r: &Results, jobs: &[&JobResult], path: &Path) -> DResult<()> {
    let series: Vec<BarSeries> = r
        .target_names()
        .into_iter()
        .map(|t| BarSeries { color: color_of(r, &t), values: jobs.iter().map(|j| j.value(&t)).collect(), label: t })
        .collect();
    let hi = series.iter().flat_map(|s| s.values.iter().flatten()).cloned().fold(1.0, f64::max);
    log_bars(jobs, &series, "metadata operations per second", "operations per second (log scale)", (hi, 2.0), None, path)
}

/// One bar per job and series, on a log scale.
struct BarSeries {
    label: String,
    color: RGBColor,
    /// Per job, in the jobs' order; `None` or non-positive: no bar.
    values: Vec<Option<f64>>,
}

/// Horizontal bars, one row per job, its series side by side, on a log x axis that spans
/// every bar (`seed`: a value the axis must include, and the margin factor at both ends);
/// `mark`: an x where a vertical line is drawn.
fn log_bars(
    jobs: &[&JobResult],
    series: &[BarSeries],
    caption: &str,
    x_desc: &str,
    seed: (f64, f64),
    mark: Option<f64>,
    path: &Path,
) -> DResult<()> {
    let n = jobs.len();
    let height = (120 + n * (14 * series.len().max(1) + 12)).max(300) as u32;
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let positive = || series.iter().flat_map(|s| s.values.iter().flatten()).cloned().filter(|v| *v > 0.0);
    let (seed_value, margin) = seed;
    let max = positive().fold(seed_value, f64::max);
    let min = positive().fold(seed_value, f64::min);
    let (lo, hi) = ((min / margin).max(1e-3), max * margin);
    let names: Vec<String> = jobs.iter().map(|j| j.job.name.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(260)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..n as f64)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| {
            let i = (*y - 0.5).round();
            if (y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                names[names.len() - 1 - i as usize].clone()
            } else {
                String::new()
            }
        })
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .disable_y_mesh()
        .draw()?;
    let bar_h = 0.8 / series.len().max(1) as f64;
    for (k, s) in series.iter().enumerate() {
        let c = s.color;
        let rects: Vec<Rectangle<(f64, f64)>> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let v = v.filter(|v| *v > 0.0)?;
                let y0 = (n - 1 - i) as f64 + 0.1 + k as f64 * bar_h;
                Some(Rectangle::new([(lo, y0), (v, y0 + bar_h * 0.9)], c.filled()))
            })
            .collect();
        chart.draw_series(rects)?.label(s.label.clone()).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    if let Some(x) = mark {
        chart.draw_series(LineSeries::new(vec![(x, 0.0), (x, n as f64)], BLACK.stroke_width(2)))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 14)?;
    root.present()?;
    Ok(())
}

/// Left: headline figure against x; right: p50 (dashed) and p99 (solid) latency, log scale.
fn sweep(r: &Results, jobs: &[&JobResult], group: &str, xlabel: &str, log_x: bool, path: &Path) -> DResult<()> {
    let metric = jobs[0].job.metric;
    let root = BitMapBackend::new(path, (1300, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(650);
    let mut xs: Vec<f64> = jobs.iter().map(|j| j.job.x).collect();
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs.dedup();
    let (xmin, xmax) = (xs[0], *xs.last().unwrap());
    let targets = r.target_names();
    let series = |t: &str, f: &dyn Fn(&JobResult) -> Option<f64>| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> =
            jobs.iter().filter(|j| j.get(t).is_some_and(|m| m.error.is_none())).filter_map(|j| Some((j.job.x, f(j)?))).collect();
        v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        v
    };
    let ymax = targets.iter().flat_map(|t| series(t, &|j| j.value(t))).map(|p| p.1).fold(0.0, f64::max) * 1.15 + 1e-9;
    let ylabel = match metric {
        Metric::Iops => "IOPS (total)",
        Metric::MiBs => "MiB/s (total)",
        Metric::OpsPerSec => "operations/s",
    };
    macro_rules! draw_left {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(xlabel)
                .y_desc(ylabel)
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 15))
                .x_label_formatter(&|x| format!("{}", *x as u64))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()?;
            for t in &targets {
                let c = color_of(r, t);
                let pts = series(t, &|j| j.value(t));
                chart
                    .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                    .label(t.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, 14)?;
        }};
    }
    let cap = format!("{group}: {ylabel}");
    if log_x && xmin > 0.0 {
        draw_left!(ChartBuilder::on(&left)
            .caption(&cap, (FONT, 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((xmin * 0.8..xmax * 1.25).log_scale(), 0.0..ymax)?);
    } else {
        let pad = (xmax - xmin) * 0.05;
        draw_left!(ChartBuilder::on(&left)
            .caption(&cap, (FONT, 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(xmin - pad..xmax + pad, 0.0..ymax)?);
    }
    // Latency panel.
    let lat = |t: &str, p99: bool| {
        series(t, &|j| j.get(t)?.fio.as_ref().map(|f| if p99 { f.lat_p99_us() } else { f.lat_p50_us() }).filter(|v| *v > 0.0))
    };
    let all: Vec<f64> = targets.iter().flat_map(|t| lat(t, true).into_iter().chain(lat(t, false))).map(|p| p.1).collect();
    let lhi = all.iter().cloned().fold(1.0, f64::max) * 2.0;
    let llo = all.iter().cloned().fold(lhi, f64::min) / 2.0;
    macro_rules! draw_right {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(xlabel)
                .y_desc("completion latency (µs, log scale)")
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 15))
                .x_label_formatter(&|x| format!("{}", *x as u64))
                .y_label_formatter(&|y| if *y >= 1.0 { format!("{y:.0}") } else { format!("{y:.2}") })
                .draw()?;
            for t in &targets {
                let c = color_of(r, t);
                chart
                    .draw_series(LineSeries::new(lat(t, true), c.stroke_width(2)))?
                    .label(format!("{t} p99"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
                let p50 = lat(t, false);
                chart.draw_series(p50.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
                chart
                    .draw_series(DashedLineSeries::new(p50.clone(), 6, 4, c.stroke_width(1)))?
                    .label(format!("{t} p50"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 6, y)], c.stroke_width(1)));
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, 13)?;
        }};
    }
    let cap = format!("{group}: latency p50 (dashed) / p99");
    if log_x && xmin > 0.0 {
        draw_right!(ChartBuilder::on(&right)
            .caption(&cap, (FONT, 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((xmin * 0.8..xmax * 1.25).log_scale(), (llo..lhi).log_scale())?);
    } else {
        let pad = (xmax - xmin) * 0.05;
        draw_right!(ChartBuilder::on(&right)
            .caption(&cap, (FONT, 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(xmin - pad..xmax + pad, (llo..lhi).log_scale())?);
    }
    root.present()?;
    Ok(())
}

/// 3D surface of MiB/s over log2(record KiB) × log2(file KiB), like iozone's gnuplot figures.
/// Cases that the matrix skips are drawn at 0. Returns false when there is no data.
fn iozone_surface(_r: &Results, jobs: &[&JobResult], op: &str, target: &str, path: &Path) -> DResult<bool> {
    let cases: Vec<(u64, u64, f64)> = jobs
        .iter()
        .filter_map(|j| match &j.job.kind {
            JobKind::Iozone { op: o, shape } if o == op => Some((shape.size, shape.bs, j.value(target)?)),
            _ => None,
        })
        .collect();
    if cases.is_empty() {
        return Ok(false);
    }
    let l2 = |b: u64| ((b / 1024) as f64).log2();
    let files: Vec<u64> = cases.iter().map(|c| c.0).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let recs: Vec<u64> = cases.iter().map(|c| c.1).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let zmax = cases.iter().map(|c| c.2).fold(1.0, f64::max) * 1.1;
    let value = |f: u64, rc: u64| cases.iter().find(|c| c.0 == f && c.1 == rc).map(|c| c.2).unwrap_or(0.0);
    let root = BitMapBackend::new(path, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (x0, x1) = (l2(recs[0]), l2(*recs.last().unwrap()));
    let (z0, z1) = (l2(files[0]), l2(*files.last().unwrap()));
    let mut chart = ChartBuilder::on(&root).caption(format!("iozone {op} on {target} (MiB/s)"), (FONT, 22)).margin(20).build_cartesian_3d(
        x0..x1.max(x0 + 1.0),
        0.0..zmax,
        z0..z1.max(z0 + 1.0),
    )?;
    chart.with_projection(|mut p| {
        p.pitch = 0.45;
        p.yaw = 0.7;
        p.scale = 0.75;
        p.into_matrix()
    });
    let size_label = |v: &f64| fmt_size(((2f64).powf(*v) * 1024.0).round() as u64);
    chart
        .configure_axes()
        .label_style((FONT, 12))
        .x_formatter(&size_label)
        .z_formatter(&size_label)
        .y_formatter(&|v| format!("{v:.0}"))
        .x_labels(recs.len().min(8))
        .z_labels(files.len().min(8))
        .draw()?;
    let xs: Vec<f64> = recs.iter().map(|&r| l2(r)).collect();
    let zs: Vec<f64> = files.iter().map(|&f| l2(f)).collect();
    let rec_at = |x: f64| recs[xs.iter().position(|v| (*v - x).abs() < 1e-9).unwrap_or(0)];
    let file_at = |z: f64| files[zs.iter().position(|v| (*v - z).abs() < 1e-9).unwrap_or(0)];
    chart.draw_series(SurfaceSeries::xoz(xs.iter().copied(), zs.iter().copied(), |x, z| value(file_at(z), rec_at(x))).style_func(
        &|&v| {
            let t = (v / zmax).clamp(0.0, 1.0);
            HSLColor(0.66 - 0.66 * t, 0.8, 0.5).mix(0.85).filled()
        },
    ))?;
    // Axis names (the 3D chart has no axis descriptions of its own).
    let style = TextStyle::from((FONT, 15).into_font()).color(&BLACK);
    root.draw_text("x: record size   z (depth): file size   y (height): MiB/s", &style, (20, 670))?;
    root.present()?;
    Ok(true)
}
