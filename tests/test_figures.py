"""Figures ready for a paper (bench_cli/results/plots.py, docs/figures.md): every
figure is a PNG and a PDF, no two series look alike, series that coincide are said to, the zoo's
labels never overlap and carry the seeds' error bars, and `attnbench profile --replot` draws a
profile's figures from its CSV without measuring."""
from __future__ import annotations

import random

import pytest

from bench_cli.commands.cli import main
from bench_cli.results import plots
from bench_cli.results.csv_store import write_rows


def ratio_rows(timed: bool = False) -> list[dict]:
    """A profile of 2 backends x 3 widths x 3 lengths: FLOPs the same under both backends (as
    measured: they do not depend on it), inference memory not."""
    rows = []
    for backend in ("math", "auto"):
        for d in (64, 128, 256):
            for n in (512, 1024, 2048):
                flops = 0.7 + d / 2000 + 100 / n
                row = {"sdpa_backend": backend, "d_model": d, "seq_len": n, "model": "attention_bn_sh",
                       "task": "lra_retrieval", "device": "cpu", "batch_size": 1,
                       "ratio_flops_train_step": flops, "ratio_flops_forward": flops,
                       "ratio_peak_mem_train_bytes": flops - 0.05,
                       "ratio_peak_mem_infer_bytes": flops - (0.3 if backend == "math" else -0.3)}
                if timed and backend == "auto" and d == 64:
                    row |= {"ratio_time_train_s": 0.8, "ratio_time_train_s_q1": 0.75, "ratio_time_train_s_q3": 0.9,
                            "ratio_time_infer_s": 0.9, "ratio_time_infer_s_q1": 0.85, "ratio_time_infer_s_q3": 0.95}
                rows.append(row)
    rows[-1]["paper_reduction_pct_flops_train_step"] = 25
    return rows


def looks(fig) -> list[list[tuple]]:
    """(colour, marker, line style) of the entries of each legend of a figure (its own and its
    axes'; the same series in two panels has one look)."""
    import matplotlib.colors as mc

    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [[(mc.to_hex(h.get_color()), h.get_marker(), h.get_linestyle())
             for h, text in zip(lg.legend_handles, lg.get_texts()) if text.get_text()]  # blanks align columns
            for lg in legends]


def test_series_styles_never_repeat_and_use_every_colour_first():
    styles = plots.series_styles(70)
    assert len(set(styles)) == 70
    assert len({s.color for s in styles[:8]}) == 8 == len(plots.PALETTE)


def test_a_figure_is_a_png_and_a_pdf_written_atomically_and_the_same_twice(tmp_path):
    """Every figure is written by one function (plots._save); the zoo's is the cheapest to write twice
    (a ratio figure's four panels cost a third more; the replots below write ratio and pba figures)."""
    path = plots.zoo_figure(crowded_zoo(6), tmp_path / "zoo.png", "t", "metric")
    pdf = tmp_path / "zoo.pdf"
    assert path == tmp_path / "zoo.png" and path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 10_000
    first = pdf.read_bytes()
    assert first[:5] == b"%PDF-" and b"/FontFile2" in first  # TrueType fonts embedded, not Type 3
    plots.zoo_figure(crowded_zoo(6), tmp_path / "zoo.png", "t", "metric")
    assert pdf.read_bytes() == first  # no creation date: the same data gives the same file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoo.pdf", "zoo.png"]  # no temporary file left


def test_the_ratio_figure_tells_every_series_apart_and_says_which_coincide():
    fig = plots.draw_ratio_figure(ratio_rows(timed=True), "Figure 1 (Primal-Dual paper): title", "subtitle")
    [entries] = looks(fig)  # one legend for the six panels
    assert len(entries) == 7 and len(set(entries)) == 7  # 6 series and the paper's star
    titles = {ax.get_title().split(",")[0] + ax.get_title().split("\n")[1]: ax.get_title() for ax in fig.axes}
    flops = [t for t in titles.values() if t.startswith("FLOPs")]
    memory_infer = next(t for t in titles.values() if t.startswith("peak memory") and "inference" in t)
    assert all("sdpa=auto coincides with sdpa=math" in t for t in flops) and len(flops) == 2
    assert "coincides" not in memory_infer
    # the timed points carry their interquartile range as error bars; the time panels say so
    time_axes = [ax for ax in fig.axes if ax.get_title().startswith("wall time")]
    assert len(time_axes) == 2 and all("IQR" in ax.get_title() for ax in time_axes)
    assert all(ax.containers for ax in time_axes)
    assert fig.get_suptitle().startswith("Figure 1 (Primal-Dual paper)")


def test_without_timings_there_is_no_time_panel():
    fig = plots.draw_ratio_figure(ratio_rows(), "t")
    assert len(fig.axes) == 4 and not any(ax.get_title().startswith("wall time") for ax in fig.axes)


def test_pba_figure2_draws_each_count_on_its_own_log_axis_and_names_twins():
    rows = [{"model": v, "d_model": d, "seq_len": 64, "heads": 1, "sdpa_backend": "auto",
             "flops_train_step": str(c * 1000 * d * d), "eqn24": str(c * 64 * d + 15 * 64 * 64)}
            for v, c in (("standard", 15), ("optimised", 12), ("efficient", 9), ("super", 12)) for d in (32, 64, 128)]
    rows = [r | {"flops_train_step": str(float(r["flops_train_step"]) + (1 if r["model"] == "super" else 0))}
            for r in rows]  # counted: super differs from optimised; Eqn. (24): the same C, the same line
    fig = plots.draw_pba_figure2(rows, {"seq_len": 64, "heads": 1}, ["standard", "optimised", "efficient", "super"],
                                 {"standard": 15, "optimised": 12, "efficient": 9, "super": 12}, "auto")
    counted, eqn = fig.axes
    assert counted.get_yscale() == eqn.get_yscale() == "log"
    assert [t.get_text() for t in eqn.get_legend().get_texts()][-1] == "super (C_Attn=12); coincides with optimised"
    assert not any("coincides" in t.get_text() for t in counted.get_legend().get_texts())
    for entries in looks(fig):
        assert len(set(entries)) == len(entries) == 4


def crowded_zoo(n: int = 30) -> list[plots.ZooPoint]:
    """Thirty attentions as the zoo's ViT case has them: most within a few seconds and points."""
    rng = random.Random(0)
    points = [plots.ZooPoint(f"attention_{i}", 30 + rng.uniform(0, 12), 12 + rng.uniform(0, 4),
                             rng.uniform(1e6, 2e8), rng.uniform(0.1, 2), rng.uniform(0.5, 6)) for i in range(n - 4)]
    points += [plots.ZooPoint("far_a", 85, 14, 1e8, 0.5, 1), plots.ZooPoint("far_b", 85.2, 14.2, 1e8, None, None),
               plots.ZooPoint("slow", 37, 120, 2e8, 3, 4), plots.ZooPoint("mid", 30, 38, 1.5e8, 1, 1)]
    return sorted(points, key=lambda p: -p.metric)


def test_the_zoo_scatter_numbers_every_point_without_overlap_and_draws_the_seeds_spread():
    from matplotlib.text import Text

    points = crowded_zoo()
    fig, labels = plots.draw_zoo_figure(points, "Attention zoo, MNIST: test accuracy vs training time",
                                        "test accuracy (%), higher is better", "mean ± std over 3 seeds")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the number's own box, not its leader line
    ax = fig.axes[0]
    assert [t.get_text() for t in labels] == [str(k) for k in range(1, 31)]
    for i, a in enumerate(boxes):
        assert ax.bbox.contains(a.x0, a.y0) and ax.bbox.contains(a.x1, a.y1), labels[i].get_text()
        for j, b in enumerate(boxes[:i]):
            assert not a.overlaps(b), (labels[i].get_text(), labels[j].get_text())
    keys = [t.get_text() for t in fig.legends[0].get_texts()]
    assert keys[0].split() == ["1", points[0].label] and len(keys) == 30
    [entries] = looks(fig)
    assert len(set(entries)) == len(entries) == 30  # 30 series, 8 colours: marker varies too
    bars = [c for c in ax.containers if c.has_xerr or c.has_yerr]
    assert len(bars) == 29  # every point with a spread over its seeds (far_b has none)
    assert sum(1 for c in bars if c.has_yerr) == 29 and sum(1 for c in bars if c.has_xerr) == 29


# --------------------------------------------------------------------------- profile --replot
REPLOT = ["trainer.progress=false", "profile.d_models=[64,128,256]", "profile.sdpa_backends=[math,auto]"]


def test_profile_replot_draws_from_the_csv_and_measures_nothing(workdir, monkeypatch, capsys):
    from bench_cli.commands.profile import grid

    columns = list(dict.fromkeys(k for r in ratio_rows(timed=True) for k in r))
    write_rows(workdir / "prof.csv", ratio_rows(timed=True), columns)
    monkeypatch.setattr(grid, "run_profile", lambda *a, **k: pytest.fail("--replot measured"))
    main(["profile", "profile=figure1", "--replot", "profile.output=prof.csv", "profile.plot=out/prof.png", *REPLOT])
    assert (workdir / "out" / "prof.png").stat().st_size > 10_000 and (workdir / "out" / "prof.pdf").is_file()
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing measured" in out and "out/prof.png (+ prof.pdf)" in out  # the PNG ratio_figure returns, its PDF beside


def test_profile_replot_without_its_csv_is_one_line_and_exit_2(workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--replot", "profile.output=missing.csv", *REPLOT])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such file: missing.csv" in err


def test_profile_replot_of_the_pba_preset_draws_its_three_figures_from_the_committed_csv(workdir, capsys):
    from bench_cli.results.csv_store import read_records
    from bench_cli.results.provenance import PROJECT_ROOT

    committed = read_records(PROJECT_ROOT / "results" / "reproduced" / "pba_flops.csv")
    small = [r for r in committed if r["heads"] in ("1", "2") and r["d_model"] in ("32", "64")
             and r["seq_len"] in ("32", "64")]  # a 2 x 2 grid: the figures' shapes, drawn quickly
    write_rows(workdir / "flops.csv", small, list(committed[0]))
    main(["profile", "profile=pba", "--replot", "profile.output=flops.csv", "trainer.progress=false",
          *(f"profile.figures.figure{n}.path=f{n}.png" for n in (2, 3, 4))])
    for n in (2, 3, 4):
        assert (workdir / f"f{n}.png").stat().st_size > 10_000 and (workdir / f"f{n}.pdf").is_file()
    assert not (workdir / "pba_params.csv").exists()  # nothing counted, nothing else written
