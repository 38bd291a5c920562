package pgque

// Exports for the external tests (package pgque_test).

// ConsumerStopping is closed once Stop was called on con and told it to
// stop fetching.
func ConsumerStopping(con *Consumer) <-chan struct{} { return con.service.Stopping() }
