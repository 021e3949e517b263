#include "core/shared_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "core/errors.h"

namespace pyring {

std::string SharedFileId::str() const {
  return str_cat(pid, ":", fd, ":", ino);
}

SharedFileId SharedFileId::parse(const std::string& s) {
  SharedFileId id;
  int used = 0;
  const bool ok = std::sscanf(s.c_str(), "%" SCNd32 ":%" SCNd32 ":%" SCNu64 "%n", &id.pid, &id.fd,
                              &id.ino, &used) == 3 &&
                  static_cast<size_t>(used) == s.size() && id.pid > 0 && id.fd >= 0;
  PYRING_CHECK(ok, CommError, "'", s, "' is not a shared file's address (pid:fd:inode)");
  return id;
}

std::string shared_file_label(const std::string& job, int rank, const std::string& channel) {
  return str_cat("pyring-", job, "-", rank, channel.empty() ? "" : "-", channel);
}

SharedFile::SharedFile(std::string label) : label_(std::move(label)) {
  const int fd = memfd_create(label_.c_str(), MFD_CLOEXEC);
  PYRING_CHECK(fd >= 0, CommError, "memfd_create(", label_, ") failed: ", std::strerror(errno));
  struct stat st{};
  if (fchmod(fd, 0600) != 0 || fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    PYRING_THROW(CommError, label_, ": fchmod/fstat failed: ", std::strerror(err));
  }
  id_.pid = static_cast<int32_t>(getpid());
  id_.fd = fd;
  id_.ino = static_cast<uint64_t>(st.st_ino);
}

SharedFile::~SharedFile() {
  close();
}

void SharedFile::close() {
  if (id_.fd >= 0) ::close(id_.fd);
  id_.fd = -1;
}

uint8_t* SharedFile::map(size_t bytes) {
  PYRING_CHECK(id_.fd >= 0, CommError, label_, ": mapped after its descriptor was closed");
  if (ftruncate(id_.fd, static_cast<off_t>(bytes)) != 0) {
    PYRING_THROW(CommError, label_, ": ftruncate to ", bytes,
                 " bytes failed: ", std::strerror(errno), " (is there that much memory?)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, id_.fd, 0);
  PYRING_CHECK(p != MAP_FAILED, CommError, label_, ": mmap of ", bytes,
               " bytes failed: ", std::strerror(errno));
  return static_cast<uint8_t*>(p);
}

uint8_t* map_shared_file(const std::string& what, const SharedFileId& id, size_t bytes) {
  const std::string path = str_cat("/proc/", id.pid, "/fd/", id.fd);
  const int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
  PYRING_CHECK(f >= 0, CommError, what, " could not be opened (", path, ": ", std::strerror(errno),
               "): the ranks of a host must run as one user, with /proc mounted, and the "
               "process that made it must be alive");
  struct stat st{};
  void* p = MAP_FAILED;
  std::string why;
  if (fstat(f, &st) != 0 || static_cast<uint64_t>(st.st_ino) != id.ino) {
    why = str_cat(path, " is another file (inode ", st.st_ino, ", not ", id.ino, ")");
  } else if (static_cast<size_t>(st.st_size) != bytes) {
    why = str_cat("it has ", st.st_size, " bytes, expected ", bytes);
  } else {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f, 0);
    if (p == MAP_FAILED) why = str_cat("mmap of ", bytes, " bytes failed: ", std::strerror(errno));
  }
  ::close(f);
  PYRING_CHECK(p != MAP_FAILED, CommError, what, ": ", why);
  return static_cast<uint8_t*>(p);
}

}  // namespace pyring
