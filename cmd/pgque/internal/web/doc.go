// Package web is the operator console that 'pgque web' serves: pages for
// queues, consumers and slots, keys and dead letters that refresh
// themselves from a JSON API, with small charts of rate and lag.
//
// Everything the browser loads is embedded in the binary (no external
// asset, works offline) and every response carries a strict
// Content-Security-Policy (default-src 'self'). Pages build the DOM with
// textContent only, so keys, reasons and payloads, which are hostile input,
// are never interpreted as markup.
//
// The console is read-only unless Config.AllowActions is set. Actions
// (unblock a key, retry its head now, replay or purge dead letters) are
// POST requests with a JSON body that must carry the token in the
// X-Pgque-Token header, come from the console's own origin (Origin and
// Sec-Fetch-Site are checked when the browser sends them) and name a Host
// the console answers to; a cookie never authorises an action, so another
// site cannot forge one. The database role the console connects as bounds
// what any action can do.
//
// With Config.RequireToken (pgque web always sets it, on loopback too:
// any local user can reach a loopback port) every API request, which is
// every read of the database, needs the token in the X-Pgque-Token
// header. The pages and static files hold no data and are served without
// it; the page's script takes the token from the address (/#token=<token>,
// which pgque web prints, or ?token=<token>) into the tab's session
// storage and sends it on each call. No cookie is ever set (TokenParam
// says why), so a page that rebinds its own DNS name to the console's
// address has no token to send and reads nothing, whatever Host it names.
//
// The keys page refreshes every five seconds and reads its views with a
// budget of ConsoleKeyScan events each; the other pages every two seconds,
// from the sampler.
//
// Goroutines: the HTTP server's, and one sampler (Server.Run) that reads
// queue rates and slot lag every Config.SampleInterval (at least ten times
// as long as the last read took) into a ring of the last HistoryLength
// samples, which the charts draw.
package web
