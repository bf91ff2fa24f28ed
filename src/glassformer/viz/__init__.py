"""Looking inside: attention heatmaps (``attention``), the interactive HTML viewer
(``viewer``) and the step-by-step trace (``trace``)."""

from glassformer.viz.attention import AttentionMaps, attention_maps, plot_attention, save_figure
from glassformer.viz.viewer import MAX_NUMBERS, AttentionView, attention_html

__all__ = [
    "MAX_NUMBERS",
    "AttentionMaps",
    "AttentionView",
    "attention_html",
    "attention_maps",
    "plot_attention",
    "save_figure",
]
