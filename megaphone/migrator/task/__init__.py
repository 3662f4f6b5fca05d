"""What runs inside a Spark task: the state operator S (:mod:`.state_operator`), the state in
transit (:mod:`.transfer`), the updates, hot keys' partials, the event-time step, and the
epoch spec a task reads. Imports only :mod:`megaphone.migrator.statedir` below it."""
