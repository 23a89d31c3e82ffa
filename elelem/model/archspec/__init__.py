"""What architecture modules (:mod:`elelem.model.archs`) are made of and share.

- :mod:`.spec`: the declarations: :class:`~.spec.Role`, :class:`~.spec.HParam`,
  :class:`~.spec.Architecture`, :class:`~.spec.Experts`;
- :mod:`.roles`: the tensor roles several architectures have (attention, the
  dense and expert FFNs, the model-wide tensors);
- :mod:`.hparams`: the hyperparameters every decoder has, and the helpers that
  read them as llama.cpp does;
- :mod:`.experts`, :mod:`.delta_net`, :mod:`.encoder`: the routing of expert
  FFNs, the Gated DeltaNet layer, the BERT-family block: each shared by
  several architectures and one native block or builder.

A role or hyperparameter only one architecture has is declared in its own
module, not here.
"""
