//! SVG line charts (latency CDFs, throughput sweeps, timelines) drawn with
//! `plotters`' SVG backend.
//!
//! Text is laid out with DejaVu Sans, which is compiled into the binary
//! (`assets/fonts/DejaVuSans.ttf`, licence in `assets/fonts/LICENSE-DejaVu.txt`)
//! and registered with plotters once per process, so rendering never looks
//! at system fonts. The SVG names the `sans-serif` family for its `<text>`
//! elements; viewers substitute their own sans-serif face.
//!
//! Rendering is deterministic: the same [`LineChart`] always gives a
//! byte-identical SVG.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// Width of the rendered chart, in pixels (at least; a key entry wider than
/// the canvas widens it, so no name is cut).
pub const WIDTH_PX: u32 = 1000;
/// Height of the plot (title, axes, data) of one panel, in pixels; the key
/// of its series is drawn below it and adds [`KEY_ROW_PX`] a row.
pub const HEIGHT_PX: u32 = 500;
/// Height of one row of the key below the plot, in pixels.
pub const KEY_ROW_PX: u32 = 20;
/// Left and right margin of the key, and its padding above and below, in pixels.
const KEY_MARGIN_PX: u32 = 12;
/// Width of a key entry's line sample and the gap after it, in pixels.
const KEY_SAMPLE_PX: u32 = 44;
/// Font size of the key's names, in pixels.
const KEY_FONT_PX: u32 = 13;
/// Distinct shapes (line dash × marker) before they repeat.
pub const SHAPES: usize = 12;

/// DejaVu Sans (Bitstream Vera licence, see `assets/fonts/LICENSE-DejaVu.txt`).
static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Font family every piece of text is drawn in (plotters' default family, so
/// mesh and legend text pick it up too).
const FONT_FAMILY: &str = "sans-serif";

/// Floor for log-scale values when no positive value is present.
const LOG_FLOOR_DEFAULT: f64 = 1e-3;

/// Okabe–Ito colour-blind-safe palette, in the order series are assigned
/// colours (series `i` gets `PALETTE[i % PALETTE.len()]` unless its
/// [`Style`] says otherwise). Yellow comes last
/// because it is the hardest to see on white.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0x00, 0x72, 0xB2), // blue
    RGBColor(0xD5, 0x5E, 0x00), // vermillion
    RGBColor(0x00, 0x9E, 0x73), // bluish green
    RGBColor(0xCC, 0x79, 0xA7), // reddish purple
    RGBColor(0x56, 0xB4, 0xE9), // sky blue
    RGBColor(0xE6, 0x9F, 0x00), // orange
    RGBColor(0x00, 0x00, 0x00), // black
    RGBColor(0xF0, 0xE4, 0x42), // yellow
];

/// One named series of (x, y) points.
///
/// Units are whatever the chart's axis labels say (e.g. x in ms, y as a
/// fraction). Points are drawn in the order given; non-finite coordinates
/// (NaN, ±∞) are skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Name shown in the key.
    pub name: String,
    /// The (x, y) points, in the units of the chart's axes.
    pub points: Vec<(f64, f64)>,
    /// Colour and shape; `None`: series `i` gets colour `i` and, past the
    /// palette, the next shape.
    pub style: Option<Style>,
}

impl Series {
    /// A series drawn in the default style of its position.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            style: None,
        }
    }

    /// The same series in `style`.
    #[must_use]
    pub fn styled(mut self, style: Style) -> Self {
        self.style = Some(style);
        self
    }
}

/// How a series is drawn: a palette colour, and a shape (a line dash and a
/// marker). A sweep gives each system a shape and each variant a colour, so
/// series that share either can still be told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Style {
    /// Palette index (taken modulo the palette's 8 colours).
    pub colour: usize,
    /// Shape index (taken modulo [`SHAPES`]): dash `shape % 4` (solid,
    /// dashed, dotted, long dashes) and marker `shape % 6` (disc, triangle,
    /// square, cross, ring, diamond).
    pub shape: usize,
}

impl Style {
    /// The default style of series `i`: colour `i`, and a new shape each time
    /// the palette comes round.
    pub fn nth(i: usize) -> Self {
        Style {
            colour: i % PALETTE.len(),
            shape: i / PALETTE.len(),
        }
    }

    fn colour(self) -> RGBColor {
        PALETTE[self.colour % PALETTE.len()]
    }

    /// `(dash, gap)` in pixels; `None` for a solid line.
    fn dash(self) -> Option<(u32, u32)> {
        match self.shape % SHAPES % 4 {
            0 => None,
            1 => Some((9, 5)),
            2 => Some((2, 4)),
            _ => Some((18, 6)),
        }
    }

    fn marker(self) -> usize {
        self.shape % SHAPES % 6
    }
}

/// Axis scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Linear axis.
    #[default]
    Linear,
    /// Base-10 logarithmic axis. Non-positive values are clamped to the
    /// smallest positive value present in the chart (or 1e-3 if none is).
    Log,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Title drawn above the plot.
    pub title: String,
    /// X-axis label, with its unit as the caller wants it shown (e.g. `"TTFT (ms)"`).
    pub x_label: String,
    /// Y-axis label, with its unit as the caller wants it shown (e.g. `"fraction of requests"`).
    pub y_label: String,
    /// Scale of the y axis (the x axis is always linear).
    pub y_scale: Scale,
    /// The series, drawn in order; series `i` gets palette colour `i` unless
    /// its [`Series::style`] says otherwise.
    pub series: Vec<Series>,
    /// Draw each series as a step function (hold y until the next x; for
    /// CDFs and timelines) without point markers, instead of straight
    /// segments with a marker on every point.
    pub step: bool,
}

/// Why a chart could not be rendered or written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The embedded font could not be registered with plotters.
    #[error("cannot register the embedded DejaVu Sans font with plotters")]
    Font,
    /// Plotters failed while drawing (to `path`, when writing to a file).
    #[error(
        "cannot draw chart {title:?}{}: {message}",
        .path.as_ref().map(|p| format!(" for {}", p.display())).unwrap_or_default()
    )]
    Draw {
        /// Title of the chart.
        title: String,
        /// File the chart was going to be written to, if any.
        path: Option<PathBuf>,
        /// The plotters error, as text.
        message: String,
    },
    /// The SVG could not be written to `path`.
    #[error("cannot write chart {title:?} to {}: {source}", .path.display())]
    Io {
        /// Title of the chart.
        title: String,
        /// File that could not be written.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Registers DejaVu Sans with plotters, once per process.
fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, DEJAVU_SANS).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// Formats a tick value compactly and deterministically: plain decimals with
/// at most 4 fractional digits in [1e-3, 1e5), scientific notation outside.
fn fmt_tick(v: f64) -> String {
    fn trim(s: &str) -> &str {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.')
        } else {
            s
        }
    }
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".to_owned()
        } else {
            format!("{v}")
        };
    }
    let a = v.abs();
    if (1e-3..1e5).contains(&a) {
        let s = format!("{v:.4}");
        let t = trim(&s);
        if t == "-0" {
            "0".to_owned()
        } else {
            t.to_owned()
        }
    } else {
        let s = format!("{v:.2e}");
        match s.split_once('e') {
            Some((mantissa, exp)) => format!("{}e{exp}", trim(mantissa)),
            None => s,
        }
    }
}

/// Pads a degenerate (single-value) linear range.
fn pad_degenerate(v: f64) -> Range<f64> {
    let pad = if v == 0.0 { 1.0 } else { v.abs() * 0.1 };
    (v - pad)..(v + pad)
}

/// Linear axis range over `[lo, hi]`, with `margin` (fraction of the span)
/// added on both sides; `0..1` when there is no data.
fn linear_range(bounds: Option<(f64, f64)>, margin: f64) -> Range<f64> {
    match bounds {
        None => 0.0..1.0,
        Some((lo, hi)) if lo >= hi => pad_degenerate(lo),
        Some((lo, hi)) => {
            let m = (hi - lo) * margin;
            (lo - m)..(hi + m)
        }
    }
}

/// Log axis range over `[lo, hi]` (both > 0), padded by 5% of the span in
/// log space (a decade each way when degenerate); `1e-3..1` with no data.
fn log_range(bounds: Option<(f64, f64)>) -> Range<f64> {
    match bounds {
        None => LOG_FLOOR_DEFAULT..1.0,
        Some((lo, hi)) if lo >= hi => (lo / 10.0)..(hi * 10.0),
        Some((lo, hi)) => {
            let f = (hi / lo).powf(0.05);
            (lo / f)..(hi * f)
        }
    }
}

/// Min and max of `values`, or `None` when empty.
fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// Turns `points` into the vertices of a post-step function: each y holds
/// until the next point's x.
fn step_vertices(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

/// Runs `$body` with `$m` bound to a closure that makes the marker of
/// `$style` at a point (data or pixel coordinates): disc, triangle, square,
/// cross, ring or diamond (each a concrete element type, so one arm each).
macro_rules! with_marker {
    ($style:expr, $m:ident => $body:expr) => {{
        let c = $style.colour();
        match $style.marker() {
            0 => {
                let $m = |at| EmptyElement::at(at) + Circle::new((0, 0), 3, c.filled());
                $body
            }
            1 => {
                let $m = |at| EmptyElement::at(at) + TriangleMarker::new((0, 0), 4, c.filled());
                $body
            }
            2 => {
                let $m = |at| EmptyElement::at(at) + Rectangle::new([(-3, -3), (3, 3)], c.filled());
                $body
            }
            3 => {
                let $m = |at| EmptyElement::at(at) + Cross::new((0, 0), 4, c.stroke_width(2));
                $body
            }
            4 => {
                let $m = |at| EmptyElement::at(at) + Circle::new((0, 0), 4, c.stroke_width(2));
                $body
            }
            _ => {
                let $m = |at| {
                    EmptyElement::at(at)
                        + Polygon::new(vec![(0, -5), (4, 0), (0, 5), (-4, 0)], c.filled())
                };
                $body
            }
        }
    }};
}

impl LineChart {
    /// The series' finite points, with y clamped to the log floor on a log
    /// scale, plus that floor.
    fn prepared_series(&self) -> Vec<Vec<(f64, f64)>> {
        let finite = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
        let floor = match self.y_scale {
            Scale::Linear => None,
            Scale::Log => Some(
                self.series
                    .iter()
                    .flat_map(|s| s.points.iter().filter(finite))
                    .map(|&(_, y)| y)
                    .filter(|&y| y > 0.0)
                    .fold(None, |m: Option<f64>, y| Some(m.map_or(y, |m| m.min(y))))
                    .unwrap_or(LOG_FLOOR_DEFAULT),
            ),
        };
        self.series
            .iter()
            .map(|s| {
                s.points
                    .iter()
                    .filter(finite)
                    .map(|&(x, y)| match floor {
                        Some(f) if y <= 0.0 => (x, f),
                        _ => (x, y),
                    })
                    .collect()
            })
            .collect()
    }

    /// Render to an SVG string: title, axis labels with units as given, the
    /// plot ([`WIDTH_PX`]×[`HEIGHT_PX`]), and below it a key with every
    /// series' full name (in as many columns as fit; the canvas widens for
    /// a name longer than it). Each series has its colour and shape
    /// ([`Style`]: a fixed colour-blind-safe palette, line dashes and
    /// markers, deterministic); markers on points unless [`step`](Self::step).
    ///
    /// Empty charts, empty series and single points render (the axis ranges
    /// are padded). Same input ⇒ byte-identical SVG.
    pub fn to_svg(&self) -> Result<String, PlotError> {
        Figure::one(self.clone()).to_svg()
    }

    /// Write [`to_svg()`](Self::to_svg) to `path` (created or truncated).
    pub fn write(&self, path: &Path) -> Result<(), PlotError> {
        Figure::one(self.clone()).write(path)
    }

    /// The key's layout for this chart's series names.
    fn key(&self) -> Result<KeyLayout, PlotError> {
        ensure_font()?;
        let font = (FONT_FAMILY, KEY_FONT_PX).into_font();
        let mut widest = 0;
        for s in &self.series {
            let (w, _) = font.box_size(&s.name).map_err(|e| PlotError::Draw {
                title: self.title.clone(),
                path: None,
                message: e.to_string(),
            })?;
            widest = widest.max(w);
        }
        let col = widest + KEY_SAMPLE_PX + 16;
        let width = WIDTH_PX.max(col + 2 * KEY_MARGIN_PX);
        let n = self.series.len();
        let cols = (((width - 2 * KEY_MARGIN_PX) / col) as usize).clamp(1, n.max(1));
        let rows = n.div_ceil(cols);
        let height = if n == 0 {
            0
        } else {
            rows as u32 * KEY_ROW_PX + 2 * KEY_MARGIN_PX
        };
        Ok(KeyLayout {
            cols,
            col,
            width,
            height,
        })
    }

    /// Draws title, mesh, series on `plot` with y coordinates `y`, and the
    /// key on `key`.
    fn draw_on<Y>(
        &self,
        plot: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        key: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        layout: &KeyLayout,
        data: &[Vec<(f64, f64)>],
        x_range: Range<f64>,
        y: Y,
    ) -> Result<(), String>
    where
        Y: AsRangedCoord<Value = f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        let mut chart = ChartBuilder::on(plot)
            .caption(&self.title, (FONT_FAMILY, 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range, y)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&|v| fmt_tick(*v))
            .y_label_formatter(&|v| fmt_tick(*v))
            .axis_desc_style((FONT_FAMILY, 16))
            .label_style((FONT_FAMILY, 13))
            .light_line_style(RGBColor(0xEE, 0xEE, 0xEE))
            .draw()
            .map_err(e)?;

        for (i, (series, points)) in self.series.iter().zip(data).enumerate() {
            let style = series.style.unwrap_or(Style::nth(i));
            let line = style.colour().stroke_width(2);
            let vertices = if self.step {
                step_vertices(points)
            } else {
                points.clone()
            };
            match style.dash() {
                None => chart
                    .draw_series(LineSeries::new(vertices, line))
                    .map(|_| ()),
                Some((dash, gap)) => chart
                    .draw_series(DashedLineSeries::new(vertices, dash, gap, line))
                    .map(|_| ()),
            }
            .map_err(e)?;
            if !self.step {
                with_marker!(style, m => chart
                    .draw_series(points.iter().map(|&p| m(p)))
                    .map(|_| ()))
                .map_err(e)?;
            }
            // the key's entry: a line sample in the series' style, its
            // marker, and its whole name
            let (row, colm) = (i / layout.cols, i % layout.cols);
            let x0 = (KEY_MARGIN_PX + colm as u32 * layout.col) as i32;
            let y = (KEY_MARGIN_PX + row as u32 * KEY_ROW_PX + KEY_ROW_PX / 2) as i32;
            let sample = vec![(x0, y), (x0 + 32, y)];
            match style.dash() {
                None => key.draw(&PathElement::new(sample, line)).map_err(e)?,
                Some((dash, gap)) => key
                    .draw(&plotters::element::DashedPathElement::new(
                        sample, dash, gap, line,
                    ))
                    .map_err(e)?,
            }
            if !self.step {
                with_marker!(style, m => key.draw(&m((x0 + 16, y)))).map_err(e)?;
            }
            key.draw(&Text::new(
                series.name.clone(),
                (x0 + KEY_SAMPLE_PX as i32, y - 7),
                (FONT_FAMILY, KEY_FONT_PX).into_font(),
            ))
            .map_err(e)?;
        }
        Ok(())
    }
}

/// Where the key's entries go: `cols` columns `col` pixels wide, on a canvas
/// `width` wide; the key is `height` pixels tall.
struct KeyLayout {
    cols: usize,
    col: u32,
    width: u32,
    height: u32,
}

/// One or more [`LineChart`]s stacked as panels in one SVG, each with its
/// own key; the panels share their axes' ranges, so they can be compared.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The panels, top to bottom.
    pub panels: Vec<LineChart>,
}

impl Figure {
    /// A figure of one chart.
    pub fn one(chart: LineChart) -> Self {
        Figure {
            panels: vec![chart],
        }
    }

    /// Render to an SVG string (panels top to bottom, each as
    /// [`LineChart::to_svg`] draws it). Same input ⇒ byte-identical SVG.
    pub fn to_svg(&self) -> Result<String, PlotError> {
        self.render(None)
    }

    /// Write [`to_svg()`](Self::to_svg) to `path` (created or truncated).
    pub fn write(&self, path: &Path) -> Result<(), PlotError> {
        let svg = self.render(Some(path))?;
        std::fs::write(path, svg).map_err(|source| PlotError::Io {
            title: self.title(),
            path: path.to_path_buf(),
            source,
        })
    }

    fn title(&self) -> String {
        self.panels
            .first()
            .map(|c| c.title.clone())
            .unwrap_or_default()
    }

    fn render(&self, path: Option<&Path>) -> Result<String, PlotError> {
        ensure_font()?;
        let draw_err = |e: String| PlotError::Draw {
            title: self.title(),
            path: path.map(Path::to_path_buf),
            message: e,
        };
        let keys = self
            .panels
            .iter()
            .map(LineChart::key)
            .collect::<Result<Vec<_>, _>>()?;
        let width = keys.iter().map(|k| k.width).max().unwrap_or(WIDTH_PX);
        let height: u32 = keys
            .iter()
            .map(|k| HEIGHT_PX + k.height)
            .sum::<u32>()
            .max(1);
        let data: Vec<Vec<Vec<(f64, f64)>>> =
            self.panels.iter().map(LineChart::prepared_series).collect();
        let all = || data.iter().flatten().flatten();
        let x_range = linear_range(bounds(all().map(|p| p.0)), 0.0);
        let y_bounds = bounds(all().map(|p| p.1));
        let log = self.panels.iter().any(|c| c.y_scale == Scale::Log);

        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
            let mut rest = root.clone();
            for ((chart, key), data) in self.panels.iter().zip(&keys).zip(&data) {
                let (panel, below) = rest.split_vertically(HEIGHT_PX + key.height);
                rest = below;
                let (plot, key_area) = panel.split_vertically(HEIGHT_PX);
                if log {
                    let y_range = log_range(y_bounds);
                    chart.draw_on(
                        &plot,
                        &key_area,
                        key,
                        data,
                        x_range.clone(),
                        y_range.log_scale(),
                    )
                } else {
                    let y_range = linear_range(y_bounds, 0.05);
                    chart.draw_on(&plot, &key_area, key, data, x_range.clone(), y_range)
                }
                .map_err(draw_err)?;
            }
            root.present().map_err(|e| draw_err(e.to_string()))?;
        }
        Ok(svg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: Vec<Series>, y_scale: Scale, step: bool) -> LineChart {
        LineChart {
            title: "TTFT CDF".to_owned(),
            x_label: "TTFT (ms)".to_owned(),
            y_label: "fraction of requests".to_owned(),
            y_scale,
            series,
            step,
        }
    }

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series::new(name, points.to_vec())
    }

    /// Parses `svg` as XML and returns the (trimmed) text of every `<text>` node.
    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("SVG is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or_default().trim().to_owned())
            .collect()
    }

    fn two_series() -> Vec<Series> {
        vec![
            series(
                "EaServe",
                &[(10.0, 0.1), (20.0, 0.5), (40.0, 0.9), (80.0, 1.0)],
            ),
            series(
                "vLLM <baseline> & co",
                &[(15.0, 0.2), (30.0, 0.4), (90.0, 1.0)],
            ),
        ]
    }

    #[test]
    fn plot_svg_has_title_labels_and_legend() {
        for scale in [Scale::Linear, Scale::Log] {
            for step in [false, true] {
                let svg = chart(two_series(), scale, step).to_svg().unwrap();
                // the plot, then one row of key (both names fit in it)
                let height = HEIGHT_PX + KEY_ROW_PX + 2 * KEY_MARGIN_PX;
                assert!(svg.contains("width=\"1000\""));
                assert!(svg.contains(&format!("height=\"{height}\"")));
                let t = texts(&svg);
                for want in [
                    "TTFT CDF",
                    "TTFT (ms)",
                    "fraction of requests",
                    "EaServe",
                    "vLLM <baseline> & co",
                ] {
                    assert!(t.iter().any(|s| s == want), "{want:?} missing from {t:?}");
                }
            }
        }
    }

    /// The key is drawn below the plot: every series name starts under the
    /// plot area, so no name covers a line or a marker.
    #[test]
    fn key_sits_below_the_plot_not_over_it() {
        let svg = chart(two_series(), Scale::Linear, false).to_svg().unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        for name in ["EaServe", "vLLM <baseline> & co"] {
            let node = doc
                .descendants()
                .find(|n| n.has_tag_name("text") && n.text().map(str::trim) == Some(name))
                .unwrap_or_else(|| panic!("{name} missing"));
            let y: f64 = node.attribute("y").unwrap().parse().unwrap();
            assert!(
                y > f64::from(HEIGHT_PX),
                "{name} at y = {y}, inside the plot"
            );
        }
    }

    /// A name wider than the canvas widens it rather than being cut; short
    /// names share a row.
    #[test]
    fn key_widens_for_long_names_and_packs_short_ones() {
        let long = "x".repeat(300);
        let c = chart(vec![series(&long, &[(0.0, 1.0)])], Scale::Linear, false);
        let k = c.key().unwrap();
        assert!(k.width > WIDTH_PX && k.cols == 1, "width {}", k.width);
        let svg = c.to_svg().unwrap();
        assert!(svg.contains(&format!("width=\"{}\"", k.width)));
        let short: Vec<Series> = (0..6)
            .map(|i| series(&format!("s{i}"), &[(0.0, 1.0)]))
            .collect();
        let k = chart(short, Scale::Linear, false).key().unwrap();
        assert_eq!((k.cols, k.width), (6, WIDTH_PX));
        assert_eq!(k.height, KEY_ROW_PX + 2 * KEY_MARGIN_PX);
    }

    /// Styles given to series: the same colour with two shapes gives two
    /// dash patterns and two markers.
    #[test]
    fn styles_set_dash_and_marker() {
        let c = chart(
            vec![
                series("a", &[(0.0, 1.0), (1.0, 2.0)]).styled(Style {
                    colour: 0,
                    shape: 0,
                }),
                series("b", &[(0.0, 2.0), (1.0, 3.0)]).styled(Style {
                    colour: 0,
                    shape: 2,
                }),
            ],
            Scale::Linear,
            false,
        );
        let svg = c.to_svg().unwrap();
        assert!(!svg.contains("#D55E00"), "both series are palette colour 0");
        // shape 2 is a dotted line drawn as many short segments and square markers
        assert_eq!(
            svg.matches("<rect").count() - 1,
            3,
            "2 points + 1 key marker (+ background)"
        );
        assert!(
            svg.matches("<polyline").count() > 4,
            "dots are separate segments"
        );
    }

    #[test]
    fn figure_stacks_panels_with_shared_axes() {
        let a = chart(
            vec![series("a", &[(0.0, 1.0), (1.0, 2.0)])],
            Scale::Linear,
            false,
        );
        let b = LineChart {
            title: "second".into(),
            series: vec![series("b", &[(0.0, 10.0), (3.0, 20.0)])],
            ..a.clone()
        };
        let svg = Figure { panels: vec![a, b] }.to_svg().unwrap();
        let one = HEIGHT_PX + KEY_ROW_PX + 2 * KEY_MARGIN_PX;
        assert!(
            svg.contains(&format!("height=\"{}\"", 2 * one)),
            "two panels tall"
        );
        let t = texts(&svg);
        assert!(t.iter().any(|s| s == "second") && t.iter().any(|s| s == "TTFT CDF"));
        // both panels' x axes run to 3
        assert_eq!(t.iter().filter(|s| *s == "3").count(), 2, "{t:?}");
    }

    #[test]
    fn plot_markers_only_without_step() {
        let with = chart(two_series(), Scale::Linear, false).to_svg().unwrap();
        let without = chart(two_series(), Scale::Linear, true).to_svg().unwrap();
        // 7 points and a marker in each of the 2 key entries
        assert_eq!(with.matches("<circle").count(), 9);
        assert_eq!(without.matches("<circle").count(), 0);
        // Distinct palette colours for the two series.
        assert!(with.contains("#0072B2") && with.contains("#D55E00"));
    }

    #[test]
    fn plot_empty_and_single_point_render() {
        let cases = vec![
            vec![],
            vec![series("empty", &[])],
            vec![series("one", &[(5.0, 2.0)])],
            vec![series("zero", &[(0.0, 0.0)])],
            vec![series("one", &[(5.0, 2.0)]), series("empty", &[])],
            vec![series("nan", &[(f64::NAN, 1.0), (1.0, f64::INFINITY)])],
            vec![series("flat", &[(1.0, 3.0), (2.0, 3.0)])],
        ];
        for s in cases {
            for scale in [Scale::Linear, Scale::Log] {
                for step in [false, true] {
                    let c = chart(s.clone(), scale, step);
                    let svg = c.to_svg().unwrap_or_else(|e| panic!("{c:?}: {e}"));
                    let t = texts(&svg);
                    for name in s.iter().map(|s| &s.name) {
                        assert!(t.contains(name), "{name} missing");
                    }
                }
            }
        }
    }

    #[test]
    fn plot_log_scale_clamps_non_positive() {
        let c = chart(
            vec![series(
                "q",
                &[(0.0, 0.0), (1.0, -3.0), (2.0, 0.01), (3.0, 100.0)],
            )],
            Scale::Log,
            false,
        );
        assert_eq!(c.prepared_series()[0][0], (0.0, 0.01));
        assert_eq!(c.prepared_series()[0][1], (1.0, 0.01));
        texts(&c.to_svg().unwrap());
        let none_positive = chart(
            vec![series("z", &[(0.0, 0.0), (1.0, -1.0)])],
            Scale::Log,
            true,
        );
        assert_eq!(
            none_positive.prepared_series()[0],
            vec![(0.0, LOG_FLOOR_DEFAULT), (1.0, LOG_FLOOR_DEFAULT)]
        );
        texts(&none_positive.to_svg().unwrap());
    }

    #[test]
    fn plot_is_deterministic() {
        for scale in [Scale::Linear, Scale::Log] {
            let a = chart(two_series(), scale, false).to_svg().unwrap();
            let b = chart(two_series(), scale, false).to_svg().unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn plot_write_creates_file_and_reports_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdf.svg");
        let c = chart(two_series(), Scale::Linear, true);
        c.write(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), c.to_svg().unwrap());

        let bad = dir.path().join("no-such-dir").join("cdf.svg");
        let err = c.write(&bad).unwrap_err();
        assert!(matches!(err, PlotError::Io { .. }));
        assert!(err.to_string().contains("no-such-dir"), "{err}");
    }

    #[test]
    fn plot_step_vertices_hold_previous_value() {
        assert_eq!(
            step_vertices(&[(1.0, 0.5), (2.0, 1.0)]),
            vec![(1.0, 0.5), (2.0, 0.5), (2.0, 1.0)]
        );
        assert!(step_vertices(&[]).is_empty());
    }

    #[test]
    fn plot_tick_format() {
        assert_eq!(fmt_tick(0.0), "0");
        assert_eq!(fmt_tick(0.5), "0.5");
        assert_eq!(fmt_tick(120.0), "120");
        assert_eq!(fmt_tick(0.0001), "1e-4");
        assert_eq!(fmt_tick(250000.0), "2.5e5");
    }

    #[test]
    fn series_past_the_palette_get_another_marker() {
        let series: Vec<Series> = (0..9)
            .map(|i| {
                Series::new(
                    format!("s{i}"),
                    vec![(0.0, i as f64), (1.0, i as f64 + 1.0)],
                )
            })
            .collect();
        let chart = LineChart {
            title: "many".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            y_scale: Scale::Linear,
            series,
            step: false,
        };
        let svg = chart.to_svg().unwrap();
        assert!(
            svg.contains("<polygon"),
            "the ninth series should use triangle markers"
        );
        let eight = LineChart {
            series: chart.series[..8].to_vec(),
            ..chart.clone()
        };
        assert!(!eight.to_svg().unwrap().contains("<polygon"));
    }
}
