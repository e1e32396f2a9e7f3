"""Looking at a program after it compiled (Thunder's own inspection module is ``thunder.examine``):
``explain()``, the fusion calls of a run, the per-region profile, nvFuser kernels per region, dataflow
graphs, and memory bandwidth."""
