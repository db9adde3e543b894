"""Training: the `fit` loop, checkpoints, callbacks, profiling, model summaries, export for serving
and delta exports that keep a serving copy current."""
from sok_tutorial._lazy import lazy_getattr

_NAMES = {
    "fit": "sok_tutorial.training.loop",
    "evaluate": "sok_tutorial.training.loop",
    "History": "sok_tutorial.training.loop",
    "make_sok_step": "sok_tutorial.training.step",
    "SokStep": "sok_tutorial.training.step",
    "StepsBySize": "sok_tutorial.training.step",
    "save_checkpoint": "sok_tutorial.training.checkpoint",
    "load_checkpoint": "sok_tutorial.training.checkpoint",
    "latest_checkpoint": "sok_tutorial.training.checkpoint",
    "CheckpointMismatch": "sok_tutorial.training.checkpoint",
    "ThroughputLogger": "sok_tutorial.training.callbacks",
    "ProfileSteps": "sok_tutorial.training.profiler",
    "op_breakdown": "sok_tutorial.training.profiler",
    "phase_totals": "sok_tutorial.training.profiler",
    "model_summary": "sok_tutorial.training.summary",
    "parameter_report": "sok_tutorial.training.summary",
    "export_model": "sok_tutorial.training.export",
    "load_export": "sok_tutorial.training.export",
    "export_model_tables": "sok_tutorial.training.delta",
    "export_delta": "sok_tutorial.training.delta",
    "apply_delta": "sok_tutorial.training.delta",
    "DeltaError": "sok_tutorial.training.delta",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_getattr(__name__, _NAMES)
