# distcomm: build, install and test entry points (see README.md).
#
#   make                      release build of the library and the binaries (cargo build --release)
#   make install PREFIX=/opt/distcomm [DESTDIR=...]   lib, header, CMake and pkg-config files, bins
#   make uninstall PREFIX=...
#   make header               regenerate include/distcomm.h (fails if cbindgen fails)
#   make test                 every test: scripts/test.sh (Rust tests, install, C tests via CMake)
#   make mpi                  libmpi_abi.so.1 (distcomm's MPI, mpi/) from the mpi crate's static library
#   make mpi-header           regenerate include/mpi.h and mpi/src/abi_gen.rs from mpi/abi/*.txt

CARGO   ?= cargo
PREFIX  ?= /usr/local
DESTDIR ?=

# Version from Cargo.toml's [package] section; soname major from it.
VERSION := $(shell awk -F'"' '/^\[/ { p = ($$0 == "[package]") } p && /^version *=/ { print $$2; exit }' Cargo.toml)
MAJOR   := $(word 1,$(subst ., ,$(VERSION)))

TARGET_DIR ?= $(if $(CARGO_TARGET_DIR),$(CARGO_TARGET_DIR),target)
RELEASE    := $(TARGET_DIR)/release
# Binaries to install when built: the known ones plus every src/bin/*.rs and src/bin/*/main.rs.
BINS := $(sort dcrun dc-bench \
          $(basename $(notdir $(wildcard src/bin/*.rs))) \
          $(notdir $(patsubst %/,%,$(dir $(wildcard src/bin/*/main.rs)))))

ABS_PREFIX := $(abspath $(PREFIX))
LIBDIR     := $(DESTDIR)$(ABS_PREFIX)/lib
INCDIR     := $(DESTDIR)$(ABS_PREFIX)/include
BINDIR     := $(DESTDIR)$(ABS_PREFIX)/bin
CMAKEDIR   := $(LIBDIR)/cmake/distcomm
PCDIR      := $(LIBDIR)/pkgconfig
SUBST      := sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@MAJOR@|$(MAJOR)|g' -e 's|@PREFIX@|$(ABS_PREFIX)|g'

.PHONY: all build install uninstall header test clean version example mpi mpi-link mpi-header

all: build

build:
	$(CARGO) build --release
	$(MAKE) --no-print-directory mpi-link

# libmpi_abi.so.1 is linked here from the mpi crate's static library (its soname and MPI_/PMPI_
# export list are given here, not by a build script).
MPI_LIBS := -ldl -lgcc_s -lutil -lrt -lpthread -lm -lc
mpi:
	$(CARGO) build --release -p distcomm-mpi
	$(MAKE) --no-print-directory mpi-link

mpi-link: $(RELEASE)/libmpi_abi.so.1

$(RELEASE)/libmpi_abi.so.1: $(RELEASE)/libmpi_abi.a mpi/exports.map
	$(CC) -shared -o $@ -Wl,-soname,libmpi_abi.so.1 -Wl,--version-script=mpi/exports.map \
	  -Wl,--whole-archive $(RELEASE)/libmpi_abi.a -Wl,--no-whole-archive $(MPI_LIBS)
	ln -sfn libmpi_abi.so.1 $(RELEASE)/libmpi_abi.so

mpi-header:
	python3 mpi/abi/gen.py

version:
	@echo $(VERSION)

install: build
	@test -n "$(VERSION)" || { echo "cannot read the version from Cargo.toml" >&2; exit 1; }
	install -d $(LIBDIR) $(INCDIR) $(CMAKEDIR) $(PCDIR)
	install -m 0755 $(RELEASE)/libdistcomm.so $(LIBDIR)/libdistcomm.so.$(VERSION)
	ln -sfn libdistcomm.so.$(VERSION) $(LIBDIR)/libdistcomm.so.$(MAJOR)
	ln -sfn libdistcomm.so.$(MAJOR) $(LIBDIR)/libdistcomm.so
	install -m 0644 $(RELEASE)/libdistcomm.a $(LIBDIR)/libdistcomm.a
	install -m 0644 include/distcomm.h $(INCDIR)/distcomm.h
	$(SUBST) cmake/distcommConfig.cmake.in > $(CMAKEDIR)/distcommConfig.cmake
	$(SUBST) cmake/distcommConfigVersion.cmake.in > $(CMAKEDIR)/distcommConfigVersion.cmake
	$(SUBST) distcomm.pc.in > $(PCDIR)/distcomm.pc
	@for b in $(BINS); do \
	  if [ -f $(RELEASE)/$$b ]; then \
	    install -d $(BINDIR) && echo "install -m 0755 $(RELEASE)/$$b $(BINDIR)/$$b" && \
	    install -m 0755 $(RELEASE)/$$b $(BINDIR)/$$b || exit 1; \
	  fi; \
	done
	@if [ -f $(RELEASE)/libmpi_abi.so.1 ]; then \
	  echo "install MPI: lib/libmpi_abi.so.1, include/mpi.h, bin/mpicc mpicxx mpiexec mpirun" && \
	  install -d $(BINDIR) && \
	  install -m 0755 $(RELEASE)/libmpi_abi.so.1 $(LIBDIR)/libmpi_abi.so.1 && \
	  ln -sfn libmpi_abi.so.1 $(LIBDIR)/libmpi_abi.so && \
	  install -m 0644 include/mpi.h $(INCDIR)/mpi.h && \
	  install -m 0755 mpi/bin/mpicc $(BINDIR)/mpicc && \
	  install -m 0755 mpi/bin/mpicxx $(BINDIR)/mpicxx && \
	  install -m 0755 mpi/bin/mpiexec $(BINDIR)/mpiexec && \
	  ln -sfn mpiexec $(BINDIR)/mpirun || exit 1; \
	fi
	@echo "installed distcomm $(VERSION) into $(DESTDIR)$(ABS_PREFIX)"

uninstall:
	rm -f $(LIBDIR)/libdistcomm.so.$(VERSION) $(LIBDIR)/libdistcomm.so.$(MAJOR) \
	      $(LIBDIR)/libdistcomm.so $(LIBDIR)/libdistcomm.a $(INCDIR)/distcomm.h \
	      $(CMAKEDIR)/distcommConfig.cmake $(CMAKEDIR)/distcommConfigVersion.cmake \
	      $(PCDIR)/distcomm.pc $(addprefix $(BINDIR)/,$(BINS)) \
	      $(LIBDIR)/libmpi_abi.so.1 $(LIBDIR)/libmpi_abi.so $(INCDIR)/mpi.h \
	      $(addprefix $(BINDIR)/,mpicc mpicxx mpiexec mpirun)
	-rmdir $(CMAKEDIR) 2>/dev/null

# build.rs writes the header on every build that changes src/; touching cbindgen.toml makes it
# run now, and DC_HEADER_STRICT=1 turns its "not regenerated" warning into an error.
header:
	touch cbindgen.toml
	DC_HEADER_STRICT=1 $(CARGO) build --lib

test:
	scripts/test.sh

example:
	scripts/example.sh

clean:
	$(CARGO) clean
	rm -rf build
