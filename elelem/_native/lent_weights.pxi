# A drafter that uses its target's token table or output in place of its own
# (EAGLE-3 heads without token_embd or output: Llama 3.1's; DFlash drafters).
# llama.cpp's eagle3 and dflash graphs read them from the target's model through
# ctx_other (src/models/eagle3.cpp, dflash.cpp: model_other->tok_embd,
# model_other->output); here the
# head's model points at the target's tensors, which stay where the target
# keeps them (its mapping, or its repacked copy of the output): nothing is
# copied, and the products are the target's own.

def borrow_target_weights(Model head, Model target):
    """Point ``head``'s missing token table (``tok_embd``) and output (an EAGLE-3
    head's ``eagle3_output``, another drafter's ``output``) at ``target``'s, which
    must be as wide as the head;
    ``head`` then keeps ``target`` alive and is closed with it.  Returns the
    roles borrowed.  A context over ``head`` is made after this call (its
    graph reads them)."""
    head._check_open()
    target._check_open()
    if head.lender is not None:
        raise errors.InvalidArgumentError("this drafter already uses another model's weights")
    cdef LayerWeights * lw = &head.layers[0]
    borrowed = []
    if head.tok_embd == NULL:
        _check_lendable(head, target, target.tok_embd, "token_embd.weight")
        head.tok_embd = target.tok_embd
        borrowed.append("tok_embd")
    if lw.eagle3_fc != NULL and lw.eagle3_output == NULL:
        _check_lendable(head, target, target.output, "output")
        if target.output.ne[1] != head.hp.n_vocab:
            raise errors.ModelShapeError(f"the target's output has {target.output.ne[1]} rows, the drafter's "
                                         f"vocabulary {head.hp.n_vocab}")
        lw.eagle3_output = target.output
        borrowed.append("output")
    elif lw.eagle3_fc == NULL and head.output == NULL:
        _check_lendable(head, target, target.output, "output")
        if target.output.ne[1] < head.hp.n_vocab:
            raise errors.ModelShapeError(f"the target's output has {target.output.ne[1]} rows, fewer than the "
                                         f"drafter's vocabulary {head.hp.n_vocab}")
        head.output = target.output
        borrowed.append("output")
    if borrowed:
        head.lender = target
    return borrowed


cdef void _check_lendable(Model head, Model target, ggml_tensor * t, str what) except *:
    if t == NULL:
        raise errors.ModelShapeError(f"the drafter has no {what} of its own and its target has none to lend")
    if t.ne[0] != head.hp.n_embd:
        raise errors.ModelShapeError(f"the drafter has no {what} of its own and its target's is {t.ne[0]} wide, "
                                     f"not the drafter's {head.hp.n_embd}")
    cdef int i
    for i in range(target.n_device_bufs):
        if t.buffer == target.device_buf[i]:   # the drafter's context computes on the CPU alone
            raise errors.InvalidArgumentError(f"the drafter uses its target's {what}, which was placed on a "
                                              f"device: keep the target's output on the CPU")
