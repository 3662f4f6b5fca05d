"""The driver side of an epoch: the routing operator F (:mod:`.routing_operator`), the Spark job
(:mod:`.spark_job`), an epoch's phases (:mod:`.run`), groups of epochs, and the collaborators
a pipeline's epochs run through (its state directory holder and its epoch driver). Imports
only :mod:`~megaphone.migrator.statedir` and :mod:`~megaphone.migrator.task` below it."""
