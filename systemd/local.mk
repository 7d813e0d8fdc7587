# SPDX-License-Identifier: MIT
# systemd/: units, sysusers.d and tmpfiles.d snippets (installed where `pkg-config systemd` says, or
# where --with-systemdsystemunitdir= puts them; nowhere with =no), and the service's config file.
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
sysusers_DATA = systemd/pagedkv.sysusers
tmpfiles_DATA = systemd/pagedkv.tmpfiles
# sysusers.d and tmpfiles.d want NAME.conf
install-data-hook: install-systemd-snippets
install-systemd-snippets:
	cd $(DESTDIR)$(sysusersdir) && mv -f pagedkv.sysusers pagedkv.conf
	cd $(DESTDIR)$(tmpfilesdir) && mv -f pagedkv.tmpfiles pagedkv.conf
uninstall-hook:
	rm -f $(DESTDIR)$(sysusersdir)/pagedkv.conf $(DESTDIR)$(tmpfilesdir)/pagedkv.conf
endif
all-local: systemd/pagedkvd.service
