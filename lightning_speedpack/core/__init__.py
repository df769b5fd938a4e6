"""The bottom room: what every tool shares and the doctor reads, importing no tool.

- :mod:`~lightning_speedpack.core.findings`: :class:`Finding` and its severity;
- :mod:`~lightning_speedpack.core.registry`: how a tool registers its diagnostic with the doctor;
- :mod:`~lightning_speedpack.core.lightning`: the Lightning namespace layer (both namespaces);
- :mod:`~lightning_speedpack.core.collectives`: the pack's own collectives, bounded in time
  (:class:`~lightning_speedpack.core.collectives.CollectiveTimeoutError`);
- :mod:`~lightning_speedpack.core.events`: a dependency-free publish/subscribe point between tools;
- :mod:`~lightning_speedpack.core.batch`: the batch size of a batch, read from shapes only;
- :mod:`~lightning_speedpack.core.trials`: training steps run aside from the fit, with every
  piece of state they touch put back exactly (used by the batch-size tuner);
- :mod:`~lightning_speedpack.core.memory`: out-of-memory errors, recognised and cleaned up.
"""

__all__: list[str] = []
