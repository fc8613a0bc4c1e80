module github.com/kubecache/k8s-memcache-selector/scripts/modproxy

go 1.25.0

require golang.org/x/mod v0.40.0
