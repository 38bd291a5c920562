// Module importcheck is a stand-in for a service that imports the pgque
// library and nothing else of this repository: scripts/importcheck lists its
// module graph and fails when a tool's dependency (River, cobra,
// progressbar, goleak, Prometheus, OpenTelemetry) leaked into it.
module example.com/importcheck

go 1.26.0

require github.com/pgque/pgque v0.0.0-00010101000000-000000000000

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/pgque/pgque => ../..
