//! A hand-written SVG chart of a sweep: throughput (left axis) and p99 latency (right axis)
//! against the swept value. Plain SVG keeps the build lean (no plotting crate) and the file
//! diff-able in `docs/`.
use std::fmt::Write as _;

const W: f64 = 820.0;
const H: f64 = 460.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 90.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 70.0;
const THROUGHPUT_COLOR: &str = "#1f77b4";
const LATENCY_COLOR: &str = "#d62728";

/// What to draw.
pub struct Chart<'a> {
    pub title: &'a str,
    /// Caption under the title (workload summary).
    pub subtitle: &'a str,
    pub x_label: &'a str,
    /// Swept values, drawn evenly spaced in the given order.
    pub xs: &'a [u32],
    pub throughput: &'a [f64],
    /// p99 latency in ms per point (`None`: not measured).
    pub p99_ms: &'a [Option<f64>],
    /// Which latency the p99 is (legend).
    pub latency_label: &'a str,
}

/// 1, 2, 2.5 or 5 × 10^k at or above `v` (an axis maximum that reads well).
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let exp = v.log10().floor();
    let base = 10f64.powf(exp);
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * base >= v {
            return m * base;
        }
    }
    10.0 * base
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A label with at most three significant digits: `80`, `687`, `5.77k`, `1.2M`.
fn short(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{}M", trim(v / 1_000_000.0))
    } else if v >= 1000.0 {
        format!("{}k", trim(v / 1000.0))
    } else {
        trim(v)
    }
}

/// `v` with decimals only where they carry information (`60555`, `17.9`, `2.25`).
fn trim(v: f64) -> String {
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

impl Chart<'_> {
    /// The SVG document.
    pub fn render(&self) -> String {
        let n = self.xs.len().max(1);
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        // points sit inside the frame, not on its edges
        let inset = 40.0;
        let x_at = |i: usize| {
            if n == 1 {
                LEFT + pw / 2.0
            } else {
                LEFT + inset + (pw - 2.0 * inset) * i as f64 / (n - 1) as f64
            }
        };
        let t_max = nice_max(self.throughput.iter().copied().fold(0.0, f64::max));
        let l_max = nice_max(self.p99_ms.iter().flatten().copied().fold(0.0, f64::max));
        let y_t = |v: f64| TOP + ph - ph * (v / t_max);
        let y_l = |v: f64| TOP + ph - ph * (v / l_max);

        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
            W / 2.0,
            esc(self.title)
        );
        let _ = writeln!(
            o,
            r##"<text x="{}" y="42" text-anchor="middle" fill="#555">{}</text>"##,
            W / 2.0,
            esc(self.subtitle)
        );
        // grid and both y axes: 5 intervals
        for k in 0..=5 {
            let f = k as f64 / 5.0;
            let y = TOP + ph - ph * f;
            let _ = writeln!(
                o,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
                LEFT + pw
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="{THROUGHPUT_COLOR}">{}</text>"#,
                LEFT - 8.0,
                y + 4.0,
                short(t_max * f)
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="start" fill="{LATENCY_COLOR}">{}</text>"#,
                LEFT + pw + 8.0,
                y + 4.0,
                trim(l_max * f)
            );
        }
        let _ = writeln!(
            o,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        // x ticks
        for (i, x) in self.xs.iter().enumerate() {
            let _ = writeln!(
                o,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#333"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
                x_at(i),
                TOP + ph,
                TOP + ph + 5.0,
                TOP + ph + 20.0,
                x
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            H - 25.0,
            esc(self.x_label)
        );
        let _ = writeln!(
            o,
            r#"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle" fill="{THROUGHPUT_COLOR}">sent events/s</text>"#,
            TOP + ph / 2.0
        );
        let _ = writeln!(
            o,
            r#"<text transform="translate({:.1} {:.1}) rotate(90)" text-anchor="middle" fill="{LATENCY_COLOR}">p99 {} (ms)</text>"#,
            W - 22.0,
            TOP + ph / 2.0,
            esc(self.latency_label)
        );
        // throughput line
        let pts: Vec<String> = self
            .throughput
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x_at(i), y_t(*v)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{THROUGHPUT_COLOR}" stroke-width="2.5"/>"#,
            pts.join(" ")
        );
        for (i, v) in self.throughput.iter().enumerate() {
            let _ = writeln!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{THROUGHPUT_COLOR}"><title>{}: {} ev/s</title></circle><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{THROUGHPUT_COLOR}" font-size="11">{}</text>"#,
                x_at(i),
                y_t(*v),
                self.xs.get(i).copied().unwrap_or_default(),
                short(*v),
                x_at(i),
                y_t(*v) - 9.0,
                short(*v)
            );
        }
        // latency line (gaps where not measured)
        let lpts: Vec<String> = self
            .p99_ms
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x_at(i), y_l(v))))
            .collect();
        if !lpts.is_empty() {
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{LATENCY_COLOR}" stroke-width="2" stroke-dasharray="6 4"/>"#,
                lpts.join(" ")
            );
        }
        for (i, v) in self.p99_ms.iter().enumerate() {
            let Some(v) = v else { continue };
            let _ = writeln!(
                o,
                r#"<rect x="{:.1}" y="{:.1}" width="7" height="7" fill="{LATENCY_COLOR}"><title>{}: p99 {} ms</title></rect><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{LATENCY_COLOR}" font-size="11">{}</text>"#,
                x_at(i) - 3.5,
                y_l(*v) - 3.5,
                self.xs.get(i).copied().unwrap_or_default(),
                trim(*v),
                x_at(i),
                y_l(*v) + 18.0,
                trim(*v)
            );
        }
        // legend
        let lx = LEFT + 12.0;
        let ly = TOP + 14.0;
        let _ = writeln!(
            o,
            r##"<rect x="{:.1}" y="{:.1}" width="230" height="44" fill="white" fill-opacity="0.85" stroke="#ccc"/>"##,
            lx - 6.0,
            ly - 10.0
        );
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{THROUGHPUT_COLOR}" stroke-width="2.5"/><text x="{:.1}" y="{:.1}">throughput (sent/s, left)</text>"#,
            lx + 26.0,
            lx + 34.0,
            ly + 4.0
        );
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{LATENCY_COLOR}" stroke-width="2" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}">p99 {} (ms, right)</text>"#,
            ly + 20.0,
            lx + 26.0,
            ly + 20.0,
            lx + 34.0,
            ly + 24.0,
            esc(self.latency_label)
        );
        o.push_str("</svg>\n");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(18_000.0), 20_000.0);
        assert_eq!(nice_max(21_000.0), 25_000.0);
        assert_eq!(nice_max(100_000.0), 100_000.0);
    }

    #[test]
    fn renders_both_series_and_escapes_text() {
        let svg = Chart {
            title: "batch <sweep>",
            subtitle: "sqlite & kafka",
            x_label: "batch size",
            xs: &[1, 10, 100],
            throughput: &[1000.0, 9000.0, 50_000.0],
            p99_ms: &[Some(3.0), None, Some(12.5)],
            latency_label: "commit→ack",
        }
        .render();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("batch &lt;sweep&gt;") && svg.contains("sqlite &amp; kafka"));
        assert!(svg.contains("50k"));
        assert_eq!(short(80.97), "81");
        assert_eq!(short(5774.0), "5.77k");
        assert_eq!(trim(60555.26), "60555");
        assert_eq!(trim(2.5), "2.5");
    }
}
