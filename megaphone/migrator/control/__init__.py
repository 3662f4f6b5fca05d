"""Control of a pipeline from outside its epochs: the runtime's facts read into ``plans/``
(:mod:`.plan_inputs`), offline migration, the DS2 autoscale controller and the top-level
``migrate()`` / ``rescale()``."""
