"""Recompute: turn a selection into a plan of segments (:mod:`.plan`), clone them into the backward
pass (:mod:`.rewrite`, with random ops replayed as :mod:`.random_ops` says), and both in one call
(:mod:`.apply`)."""
