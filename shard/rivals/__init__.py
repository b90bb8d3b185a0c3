"""The rival indexes of the seed papers, each behind the interface of ``shard.rivals.base``
(``RivalIndex``) so that the benchmarks and the cluster take any of them where they take the
AP-Tree: ``shard.indexes`` names them (``rt``, ``rt+``, ``rt++``, ``mbrtrie``, ``ptquadtree``,
``lfilter``, ``iqtree``, ``rqtree``), ``shard.rivals.hosted`` gives one the AP+-Tree's face for
a shard (live messages and moving subscriptions).

Each module follows its paper and names the section at each step; where a paper is ambiguous,
the module's docstring says what was chosen (docs/COMPARE.md collects them).
"""
