module github.com/kubecache/k8s-memcache-selector

go 1.25

require (
	github.com/bradfitz/gomemcache v0.0.0-20260422231931-4d751bb6e37c
	github.com/cespare/xxhash/v2 v2.3.0
)
