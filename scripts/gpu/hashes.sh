# Sourced by scripts/gpu/bundle.sh (here) and scripts/gpu/run.sh (on the GPU machine): the hashes
# that tie a bundle's prebuilt parts to the sources they were made from. LC_ALL=C: the same file
# order whatever the machine's locale.
# The TypeScript sources dist/ is compiled from.
ts_sources_hash() {
  cat tsconfig.json $(find lib workflows activities workers native bench test -name '*.ts' | LC_ALL=C sort) | sha256sum | cut -c1-16
}
# The addon's sources and build files.
native_sources_hash() {
  cat native/CMakeLists.txt $(find native/cmake native/src -type f | LC_ALL=C sort) | sha256sum | cut -c1-16
}
