"""One rank's part of a step: the schedule, the runtime that runs it, the client's and the servers' steps."""
