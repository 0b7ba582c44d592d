"""Scripted fakes for unit tests of code that talks to Kafka, without a broker (issue 29's seams).

`onceflow.testing.kafka`: an in-memory cluster that keeps transactions as Kafka does (records and group offsets
visible on commit only, an epoch per transactional id that fences the older producer), a producer whose calls
can be scripted to fail, and the exactly-once sink's reads over that cluster. No platform module imports this
package (an import-linter contract); the real-broker suites prove what the fakes only model.
"""
