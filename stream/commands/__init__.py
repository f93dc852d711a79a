"""The offline commands: ``tops replay`` and ``replay-categorical``, ``evaluate``, ``query``, ``compare`` (and
``--mode local``, ``compare-categorical``), ``simulate`` and ``state``, with the shipped data sets and input readers.
They run the same operators as the daemon; they may import ``daemon``, ``state`` and ``core``, never the reverse."""
