"""Looking inside: attention heatmaps (``attention``) and the step-by-step trace (``trace``)."""

from glassformer.viz.attention import AttentionMaps, attention_maps, plot_attention, save_figure

__all__ = ["AttentionMaps", "attention_maps", "plot_attention", "save_figure"]
