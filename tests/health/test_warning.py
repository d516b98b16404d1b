"""What a health check reports: a warning names its iterations, its plot and the remedy."""

from __future__ import annotations

from polyturn.health.warning import TrainingWarning, format_warning


def test_format_warning_links_the_plot(tmp_path):
    w = TrainingWarning("plateau", "charts/success_rate", "no improvement", 10, 29)
    text = format_warning(w, plot_dir=tmp_path, drawn_by="polyturn diagnose --run X")
    assert f"plot: {tmp_path / 'training.png'} (drawn by polyturn diagnose --run X)" in text
    assert w.where == "iterations 10-29" and "remedy:" in text
