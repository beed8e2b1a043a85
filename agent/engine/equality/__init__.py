"""owl:sameAs by rewriting: the parts of ``agent/engine/equality/layer.py``.

``classes``   the representative of every term (the paper's pi), merged and split
``component`` which rules decide equality (the equality component) and the checks on them
``facts``     an indexed fact set and the join of a rule body over it
``rewriting`` the equality component materialised with rewriting; insertions
``bf``        deletions by B/F~ (Motik et al., "Combining Rewriting and Incremental
              Materialisation Maintenance for Datalog Programs with Equality", Alg. 1-7)
``expansion`` the expanded model readers see
"""
