// Package deploy holds no code: its tests check the packaging beside it
// (the image, the Kubernetes manifests, the compose file and the systemd
// units). See docs/operations.md.
package deploy
