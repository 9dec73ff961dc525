package deploy

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// LoadCompose loads a compose file as `docker compose` does: validated
// against the compose specification's schema (unknown keys are refused),
// interpolated with an empty environment, normalised.
func LoadCompose(ctx context.Context, file string) (*types.Project, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	return loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("registryd", true) })
}

// CheckCompose returns every problem with the local stack: PostgreSQL
// healthy first, a one-shot migration, registryd started only after it
// succeeded, with a health check its image can run, a token key, and only
// settings registryd reads. dockerfile is deploy/Dockerfile's text.
func CheckCompose(p *types.Project, server []string, dockerfile string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	svc := func(name string) (types.ServiceConfig, bool) {
		s, err := p.GetService(name)
		if err != nil {
			bad("no %s service (have %v)", name, p.ServiceNames())
			return s, false
		}
		return s, true
	}
	pg, ok1 := svc("postgres")
	mig, ok2 := svc("migrate")
	reg, ok3 := svc("registryd")
	if !ok1 || !ok2 || !ok3 {
		return problems
	}
	if pg.HealthCheck == nil || len(pg.HealthCheck.Test) == 0 || pg.HealthCheck.Disable {
		bad("postgres has no health check, so nothing can wait for it")
	}
	// The binary the image holds, and its health check.
	final := dockerfile[strings.LastIndex(dockerfile, "\nFROM "):]
	if !strings.Contains(final, "COPY --from=build /out/registryd /registryd") {
		bad("deploy/Dockerfile's last stage does not put the binary at /registryd")
	}
	if !strings.Contains(final, `CMD ["/registryd", "healthcheck"`) {
		bad("deploy/Dockerfile's last stage has no HEALTHCHECK that runs /registryd healthcheck")
	}
	depends := func(s types.ServiceConfig, on, cond string) {
		if d, ok := s.DependsOn[on]; !ok || d.Condition != cond {
			bad("%s does not depend on %s with condition %s (depends_on: %v)", s.Name, on, cond, s.DependsOn)
		}
	}
	// The migration: once, before registryd.
	if !slices.Equal(mig.Command, types.ShellCommand{"migrate", "up"}) {
		bad("migrate runs %v, want migrate up", mig.Command)
	}
	if mig.Restart != "" && mig.Restart != "no" {
		bad("migrate restarts (%s); it is a one-shot", mig.Restart)
	}
	depends(mig, "postgres", types.ServiceConditionHealthy)
	depends(reg, "migrate", types.ServiceConditionCompletedSuccessfully)
	if mig.Image != reg.Image || mig.Image == "" {
		bad("migrate runs image %q, registryd %q: the migrations must be the server's", mig.Image, reg.Image)
	}
	for _, s := range []types.ServiceConfig{mig, reg} {
		if s.Build == nil || filepath.Base(s.Build.Dockerfile) != "Dockerfile" || !strings.HasSuffix(filepath.ToSlash(s.Build.Dockerfile), "deploy/Dockerfile") {
			bad("%s is not built from deploy/Dockerfile: %+v", s.Name, s.Build)
		}
		for name := range s.Environment {
			if !slices.Contains(server, name) {
				bad("%s sets %s, which registryd does not read", s.Name, name)
			}
		}
		u, err := url.Parse(deref(s.Environment["REGISTRY_DATABASE_URL"]))
		if err != nil || u.Hostname() != "postgres" || u.Port() != "5432" {
			bad("%s's REGISTRY_DATABASE_URL is not the postgres service's", s.Name)
		} else if u.Path != "/"+deref(pg.Environment["POSTGRES_DB"]) || u.User.Username() != deref(pg.Environment["POSTGRES_USER"]) {
			bad("%s's REGISTRY_DATABASE_URL names database %s as %s; postgres makes %s for %s", s.Name, u.Path, u.User.Username(),
				deref(pg.Environment["POSTGRES_DB"]), deref(pg.Environment["POSTGRES_USER"]))
		}
	}

	// registryd.
	if !slices.Equal(reg.Command, types.ShellCommand{"serve"}) && len(reg.Command) != 0 {
		bad("registryd runs %v, want serve", reg.Command)
	}
	if v := deref(reg.Environment["REGISTRY_MIGRATE"]); v != "" && v != "false" {
		bad("registryd has REGISTRY_MIGRATE=%s: migrating is the migrate service's job", v)
	}
	hc := reg.HealthCheck
	switch {
	case hc == nil || hc.Disable || len(hc.Test) < 3:
		bad("registryd has no health check")
	case hc.Test[0] != "CMD" || hc.Test[1] != "/registryd" || hc.Test[2] != "healthcheck":
		bad("registryd's health check runs %v; the image has no shell or curl, only /registryd healthcheck", hc.Test)
	case hc.Timeout == nil || hc.Interval == nil:
		bad("registryd's health check has no interval or timeout")
	}
	_, port, _ := strings.Cut(deref(reg.Environment["REGISTRY_LISTEN"]), ":")
	if !slices.ContainsFunc(reg.Ports, func(p types.ServicePortConfig) bool { return fmt.Sprint(p.Target) == port }) {
		bad("registryd publishes %v, not REGISTRY_LISTEN's port %q", reg.Ports, port)
	}
	for _, pc := range reg.Ports {
		if pc.HostIP != "127.0.0.1" {
			bad("registryd is published on %q, beyond this machine", pc.HostIP)
		}
	}
	if !reg.ReadOnly || !slices.Contains(reg.CapDrop, "ALL") || !slices.Contains(reg.SecurityOpt, "no-new-privileges:true") {
		bad("registryd: want a read-only root, every capability dropped and no-new-privileges")
	}
	// The token key: a file in a volume some one-shot service fills, and
	// registryd waits for it.
	keyFile := deref(reg.Environment["REGISTRY_JWT_SECRET_FILE"])
	if reg.Environment["REGISTRY_JWT_SECRET"] != nil || reg.Environment["REGISTRY_JWT_PUBLIC_KEYS"] != nil {
		bad("registryd's token key is in the compose file")
	}
	var keyVolume string
	for _, v := range reg.Volumes {
		if keyFile != "" && filepath.Dir(keyFile) == v.Target && v.Type == types.VolumeTypeVolume {
			keyVolume = v.Source
			if !v.ReadOnly {
				bad("registryd mounts its token key's volume writable")
			}
		}
	}
	if keyVolume == "" {
		bad("REGISTRY_JWT_SECRET_FILE %q is in no volume of registryd's: with REGISTRY_DATABASE_URL, registryd needs a token key", keyFile)
		return problems
	}
	maker := ""
	for _, s := range p.Services {
		for _, v := range s.Volumes {
			if s.Name != reg.Name && v.Source == keyVolume && !v.ReadOnly {
				maker = s.Name
			}
		}
	}
	if maker == "" {
		bad("no service writes the token key's volume %q", keyVolume)
	} else {
		depends(reg, maker, types.ServiceConditionCompletedSuccessfully)
	}
	return problems
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
