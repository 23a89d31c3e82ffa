"""Models (layer 3): the architectures as data (:mod:`.architectures`) and the
packaged models, fetched from PyPI and cached (:mod:`.hub`).

Nothing is imported here, so that ``elelem.model.hub`` (which the CLI needs
for ``--help``) loads without the GGUF reader and NumPy.
"""
