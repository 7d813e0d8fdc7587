# SPDX-License-Identifier: MIT
# systemd/: units, sysusers.d and tmpfiles.d snippets (where configure.ac decides: under the prefix,
# or pkg-config systemd's places for --prefix=/usr; --with-*dir= choose, =no skips), and the config file.
pagedkvconfdir = $(sysconfdir)/pagedkv
dist_pagedkvconf_DATA = systemd/pagedkvd.conf
EXTRA_DIST += systemd/pagedkvd.service.in systemd/pagedkvd.socket systemd/pagedkv.sysusers \
	systemd/pagedkv.tmpfiles

# Paths in the unit are the configured ones, substituted at make time (configure leaves ${prefix} in them).
systemd/pagedkvd.service: systemd/pagedkvd.service.in Makefile
	$(AM_V_GEN)$(MKDIR_P) systemd && sed -e 's|@sbindir[@]|$(sbindir)|g' -e 's|@sysconfdir[@]|$(sysconfdir)|g' \
		-e 's|@pkglibdir[@]|$(pkglibdir)|g' $(srcdir)/systemd/pagedkvd.service.in >$@
CLEANFILES += systemd/pagedkvd.service

if HAVE_SYSTEMD
systemdsystemunit_DATA = systemd/pagedkvd.service systemd/pagedkvd.socket
endif
# sysusers.d and tmpfiles.d want NAME.conf
if HAVE_SYSUSERS
sysusers_DATA = systemd/pagedkv.sysusers
install-data-hook: install-sysusers
install-sysusers:
	cd $(DESTDIR)$(sysusersdir) && mv -f pagedkv.sysusers pagedkv.conf
uninstall-hook: uninstall-sysusers
uninstall-sysusers:
	rm -f $(DESTDIR)$(sysusersdir)/pagedkv.conf
endif
if HAVE_TMPFILES
tmpfiles_DATA = systemd/pagedkv.tmpfiles
install-data-hook: install-tmpfiles
install-tmpfiles:
	cd $(DESTDIR)$(tmpfilesdir) && mv -f pagedkv.tmpfiles pagedkv.conf
uninstall-hook: uninstall-tmpfiles
uninstall-tmpfiles:
	rm -f $(DESTDIR)$(tmpfilesdir)/pagedkv.conf
endif
all-local: systemd/pagedkvd.service
