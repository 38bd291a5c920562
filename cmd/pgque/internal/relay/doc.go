// Package relay delivers the events of a partitioned consumer to an HTTP
// endpoint, one POST per event, in the CloudEvents HTTP binding (binary
// mode). It is the engine of `pgque relay`: the hard parts of consuming
// (slots, leases, fencing, failure policies, retries) stay in the Go worker
// pool, and an application in any language only answers HTTP requests.
//
// A Relay is a pgque.HandlerFunc. Each slot of the pool handles its chunk
// one event after another, so the next event of a key is posted only after
// the previous one was answered, and no two requests of one key are ever in
// flight at once. Failures are classified by where they come from:
//
//   - The endpoint answered about the event (5xx, 408, 429, a timeout, a
//     broken connection after the request was sent, other 4xx): the event
//     is nacked and redelivered with the consumer's backoff, or after the
//     response's Retry-After; under the pause policy only its key waits.
//   - The endpoint answered that the event can never succeed (422, or any
//     non-2xx with "pgque-dead-letter: 1"): it is dead-lettered at once.
//   - The endpoint could not be reached or is misconfigured (dial, DNS and
//     TLS errors, a redirect, 401/403/404/405/407/421): no event is at
//     fault, so none is charged a retry. The request is repeated with a
//     capped, jittered backoff until the endpoint answers; the slot stays
//     owned (its lease is renewed in the background) and resumes by itself.
//
// See docs/relay.md for the header and status-code contract.
package relay
