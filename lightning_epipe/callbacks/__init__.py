"""Callbacks that show what the pipeline does: :class:`EPipeMonitor` and its arithmetic."""

from lightning_epipe.callbacks.meter import Measurement, PipelineLink, PipelineMeter, format_summary, pipeline_links
from lightning_epipe.callbacks.monitor import EPipeMonitor

__all__ = ["EPipeMonitor", "PipelineMeter", "Measurement", "PipelineLink", "pipeline_links", "format_summary"]
