"""The scheduler's gRPC contract, generated from proto/luftpause/rpc/scheduler.proto by
`make proto` (a test fails when it is stale). Only the wire and link/rpc modules import it."""
