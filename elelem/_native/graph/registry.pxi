# The graph-builder registry, included into core.pyx before the builders.
#
# A graph builder is one file graph/arch_<name>.pxi whose last line registers
# it under a name; an architecture module (elelem/model/archs/<arch>.py) names
# the builder its models run on.  setup.py generates graph/all_builders.pxi, which includes every
# graph/arch_*.pxi: nothing else lists them.

ctypedef ggml_tensor * (*GraphBuilder)(Model m, KVCache cache, Step * st) except NULL

DEF MAX_BUILDERS = 64
cdef GraphBuilder _builders[MAX_BUILDERS]
cdef list _builder_names = []


cdef void _register_builder(str name, GraphBuilder build) except *:
    if name in _builder_names or len(_builder_names) >= MAX_BUILDERS:
        raise RuntimeError(f"graph builder {name!r} registered twice, or too many builders")
    _builders[len(_builder_names)] = build
    _builder_names.append(name)


cdef int _builder_id(str name) except -1:
    if name not in _builder_names:
        raise errors.UnsupportedArchitectureError(
            f"no graph builder named {name!r}; built in: {', '.join(sorted(_builder_names))}")
    return _builder_names.index(name)


def graph_builders():
    """The names of the graph builders compiled into the core."""
    return list(_builder_names)
