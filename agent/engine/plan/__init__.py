"""From a rule to code: body order and cost estimates, hypertree decompositions, the shapes a
plan may take (rewrites), the compiler and the executor that caches plans."""
