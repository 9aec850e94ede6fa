// Command etcd is etcd's own server entry point, rebuilt here because
// go.etcd.io/etcd/server/v3 replaces its sibling modules with relative paths
// and so cannot be `go install`ed from the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
