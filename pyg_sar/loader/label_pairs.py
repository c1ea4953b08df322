"""The checks of a link loader's ``edge_label_index`` and ``edge_label``,
shared by the homogeneous (:mod:`~pyg_sar.loader.link_loader`) and the
heterogeneous (:mod:`~pyg_sar.loader.hetero_link_loader`) loader: one line naming
the bad value, before any batch."""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor


def check_label_pairs(pairs, limits: Sequence[Tuple[int, str]],
                      label: Optional[Tensor], of: str = '') -> Tensor:
    r"""Returns :obj:`pairs` (a ``[2, num_pairs]`` tensor, or a pair of
    sequences) as an int64 tensor, after checking its shape, its dtype, each
    row's ids against :obj:`limits` (``(number of nodes, what the ids
    are)`` for the source and destination rows) and the length of
    :obj:`label`. :obj:`of` qualifies the name in messages (e.g. ``" of
    edge type ..."``)."""
    if isinstance(pairs, (tuple, list)):
        pairs = torch.stack([torch.as_tensor(t) for t in pairs])
    if not isinstance(pairs, Tensor) or pairs.dim() != 2 or \
            pairs.size(0) != 2:
        raise ValueError(f"'edge_label_index'{of} must have shape [2, "
                         f"num_pairs] (got "
                         f"{list(getattr(pairs, 'shape', []))})")
    if pairs.is_floating_point() or pairs.dtype == torch.bool:
        raise TypeError("'edge_label_index' must hold integer node ids")
    pairs = pairs.long()
    for i, (n, what) in enumerate(limits):
        if pairs.size(1) and (int(pairs[i].min()) < 0 or
                              int(pairs[i].max()) >= n):
            raise ValueError(f"'edge_label_index'{of} row {i} holds ids "
                             f"outside [0, {n}) ({what})")
    if label is not None and label.size(0) != pairs.size(1):
        raise ValueError(f"'edge_label' has {label.size(0)} entries for "
                         f"{pairs.size(1)} pairs")
    return pairs

