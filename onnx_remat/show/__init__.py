"""Pictures and pages: the graph around the recomputed scopes (:mod:`.graph_view`), the memory
timeline (:mod:`.timeline`) and the self-contained HTML report (:mod:`.report`)."""
