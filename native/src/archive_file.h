// Writing a libtorch archive to a file so that a failed write (a full disk) is an ordinary error.
//
// libtorch's own file writer (OutputArchive::save_to(path)) throws from PyTorchStreamWriter's
// destructor when a write fails part way, which terminates the process (the trainer died with
// "unexpected pos" on a full disk instead of failing its checkpoint). Here the archive streams
// through a writer that keeps the first error and drops the bytes after it, so libtorch always
// finishes; the error is then thrown naming the file and errno ("No space left on device"), after
// the file is removed.
#pragma once

#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace prime {

/** Writes `archive` to `path` and fsyncs it; throws std::runtime_error naming the file and errno on failure. */
inline void saveArchiveFile(torch::serialize::OutputArchive& archive, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot open '" + path + "' for writing: " + std::strerror(errno));
  int error = 0;
  archive.save_to([&](const void* data, size_t size) -> size_t {
    if (error == 0 && size > 0 && std::fwrite(data, 1, size, f) != size) error = errno != 0 ? errno : EIO;
    return size;  // never short: libtorch must reach its end of file (see above)
  });
  if (std::fflush(f) != 0 && error == 0) error = errno;
  if (error == 0 && ::fsync(::fileno(f)) != 0) error = errno;
  if (std::fclose(f) != 0 && error == 0) error = errno;
  if (error != 0) {
    std::remove(path.c_str());
    throw std::runtime_error("writing '" + path + "' failed: " + std::strerror(error));
  }
}

}  // namespace prime
