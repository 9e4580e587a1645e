"""The compute model a configuration runs with (:func:`compute_model_for`), in its own module so that a run
without pipeline parallelism never imports :mod:`sim.timing.pipeline` (start-up, issue 32)."""
from __future__ import annotations

from sim.timing.compute import RooflineComputeModel


def compute_model_for(config, **fields_) -> RooflineComputeModel:
    """The compute model of a :class:`sim.setup.config.SimConfig`: the roofline of the whole model at ``config.tp``,
    or with ``config.pp > 1`` its :class:`sim.timing.pipeline.PipelineComputeModel`; ``fields_`` set compute fields;
    ``config.cuda_graph_decodes`` (when not None) sets ``decode_graphs`` (a profile's fields replace it later)."""
    if getattr(config, "cuda_graph_decodes", None) is not None:
        fields_.setdefault("decode_graphs", float(config.cuda_graph_decodes))
    if config.pp > 1:
        from sim.timing.pipeline import PipelineComputeModel    # imported only for pipeline parallelism (start-up)
        return PipelineComputeModel(config.full_model_spec, config.gpu_spec, config.tp, pp=config.pp, **fields_)
    return RooflineComputeModel(config.full_model_spec, config.gpu_spec, config.tp, **fields_)
