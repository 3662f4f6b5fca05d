"""The state directory on the driver's disk: the commit record, the driver's durable copy, the
inbox of plans posted from elsewhere, recovery, the process's registry of open pipelines and
the crash points. The lowest room of :mod:`megaphone.migrator`: it imports no other room."""
