//! Every kind of plot the docs show, checked as a picture: rendered to PNG
//! with resvg (DejaVu Sans as the `sans-serif` face, the font the plots are
//! laid out with), every text's box must lie inside the canvas, and no two
//! key entries may overlap. Found in the second newcomer pass (issue 36):
//! the legend's names ran off the right edge. The PNGs are left in
//! `target/tmp/plots_render/` to be looked at.

use crate::easerve;
use std::path::Path;

/// The font the plots are laid out with (`study/src/plot.rs`).
const DEJAVU: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// Boxes of every text node of `g` and its descendants, in canvas pixels.
fn text_boxes(g: &resvg::usvg::Group, out: &mut Vec<(String, resvg::usvg::Rect)>) {
    for n in g.children() {
        match n {
            resvg::usvg::Node::Group(g) => text_boxes(g, out),
            resvg::usvg::Node::Text(t) => {
                let text: String = t.chunks().iter().map(|c| c.text()).collect();
                out.push((text, t.abs_bounding_box()));
            }
            _ => {}
        }
    }
}

/// Renders `svg` to `png` and checks its text; the number of texts.
fn check_picture(svg: &Path, png: &Path) -> usize {
    let mut opt = resvg::usvg::Options::default();
    opt.fontdb_mut().load_font_data(DEJAVU.to_vec());
    opt.fontdb_mut().set_sans_serif_family("DejaVu Sans");
    let text = std::fs::read_to_string(svg).unwrap();
    let tree = resvg::usvg::Tree::from_str(&text, &opt)
        .unwrap_or_else(|e| panic!("{}: {e}", svg.display()));
    let size = tree.size();
    let (w, h) = (size.width(), size.height());
    let mut pixmap = resvg::tiny_skia::Pixmap::new(w as u32, h as u32).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap.save_png(png).unwrap();
    assert!(
        pixmap.pixels().iter().any(|p| p.red() < 128),
        "{}: nothing drawn",
        svg.display()
    );
    let mut boxes = Vec::new();
    text_boxes(tree.root(), &mut boxes);
    assert!(!boxes.is_empty(), "{}: no text laid out", svg.display());
    for (t, b) in &boxes {
        assert!(
            b.left() >= -0.5 && b.top() >= -0.5 && b.right() <= w + 0.5 && b.bottom() <= h + 0.5,
            "{}: {t:?} at [{:.0}, {:.0}]–[{:.0}, {:.0}] runs off the {w}×{h} canvas",
            svg.display(),
            b.left(),
            b.top(),
            b.right(),
            b.bottom()
        );
    }
    // the key's names (below each plot, at its left margin or in a column)
    // never overlap one another
    for (i, (ta, a)) in boxes.iter().enumerate() {
        for (tb, b) in &boxes[i + 1..] {
            let overlap = a.left() < b.right() - 1.0
                && b.left() < a.right() - 1.0
                && a.top() < b.bottom() - 1.0
                && b.top() < a.bottom() - 1.0;
            let key = |t: &str| t.len() > 12;
            assert!(
                !(overlap && key(ta) && key(tb)),
                "{}: {ta:?} overlaps {tb:?}",
                svg.display()
            );
        }
    }
    boxes.len()
}

fn run(args: &[&str]) {
    let r = easerve(args);
    assert!(
        r.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
}

#[test]
fn every_plot_renders_with_its_text_on_the_canvas() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // a sweep with 3 variants × 3 systems: 9 series, so one panel per system
    let sweep = d.join("sweep");
    run(&[
        "sweep",
        "scenarios/image.toml",
        "--rates",
        "1,3",
        "--set",
        "cluster.link=pcie4-x16,pcie5-x16,nvlink4",
        "--set",
        "deployment.batch=4",
        "--systems",
        "passthrough,aggregated,easerve-s1",
        "--seeds",
        "1",
        "--requests",
        "60",
        "--out",
        sweep.to_str().unwrap(),
    ]);
    let mut svgs: Vec<_> = std::fs::read_dir(&sweep)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        .collect();
    // the capacity plots: one cluster, and GPU types compared
    for (name, extra) in [
        ("capacity.svg", vec![]),
        (
            "capacity-gpus.svg",
            vec!["--gpus", "a100-sxm4-80gb", "--tolerance", "0.2"],
        ),
    ] {
        let plot = d.join(name);
        let mut args = vec![
            "capacity",
            "scenarios/image.toml",
            "--slo",
            "moderate",
            "--requests",
            "60",
            "--plot",
            plot.to_str().unwrap(),
        ];
        args.extend(extra);
        run(&args);
        svgs.push(plot);
    }
    svgs.sort();
    assert!(svgs.len() >= 10, "{svgs:?}");
    // the pictures are kept for a person to look at
    let pngs = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plots_render");
    std::fs::create_dir_all(&pngs).unwrap();
    for svg in &svgs {
        let png = pngs.join(svg.with_extension("png").file_name().unwrap());
        let texts = check_picture(svg, &png);
        assert!(texts > 5, "{}: {texts} texts", svg.display());
    }
    // more than 8 series: a panel per system, each with the variants' full labels
    let goodput = std::fs::read_to_string(sweep.join("goodput-moderate.svg")).unwrap();
    for system in ["passthrough", "aggregated", "easerve-s1"] {
        assert!(
            goodput.contains(&format!("Goodput at the moderate SLO tier: {system}")),
            "no panel for {system}"
        );
    }
    assert!(goodput.contains("easerve-s1 [cluster.link=nvlink4, deployment.batch=4]"));
    // the GPU comparison marks each type's answer and draws the goal's line
    let gpus = std::fs::read_to_string(d.join("capacity-gpus.svg")).unwrap();
    assert!(gpus.contains("× offered"), "no attainment line");
    assert!(gpus.matches(": highest ").count() >= 2, "answers unmarked");
}

/// The check itself: a legend name drawn where the old legend column put
/// it, near the right edge, is caught.
#[test]
#[should_panic(expected = "runs off")]
fn the_check_catches_a_name_cut_at_the_edge() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("cut.svg");
    std::fs::write(
        &svg,
        r#"<svg width="1000" height="100" viewBox="0 0 1000 100" xmlns="http://www.w3.org/2000/svg">
<rect x="0" y="0" width="1000" height="100" fill="white"/>
<line x1="0" y1="50" x2="800" y2="50" stroke="black"/>
<text x="20" y="30" font-family="sans-serif" font-size="13">a title</text>
<text x="836" y="60" font-family="sans-serif" font-size="13">passthrough [cluster.link.bandwidth_gbs=8]</text>
</svg>"#,
    )
    .unwrap();
    check_picture(&svg, &dir.path().join("cut.png"));
}
