// Package usage is the gateway's ledger of the token usage agents report, and the
// per-principal token budgets it enforces.
//
// The ledger lives in a JetStream KV bucket beside the run logs (Config.JetStream), so every
// gateway sharing the NATS shares it. A run's usage is recorded once (Ledger.Record), by the
// gateway that produced the run, when its terminal is stored; two keys hold it:
//
//   - run.<principal hash>.<run hash>: the run's record (principal, thread, runId and the
//     generation of its log, agent, usage by model, when), created with Create, so that a
//     second recording of the same run (a retry, another producer of the same generation)
//     finds it there and counts nothing;
//   - agg.<period length>.<period start>.<principal hash>: the principal's aggregate of one
//     period (Config.Period, in seconds, aligned on the Unix epoch): totals, runs, and a breakdown by thread
//     and by model, updated by compare-and-set. The aggregate remembers the last runs it
//     added (recentRuns), so that an update retried after a lost answer adds nothing twice.
//
// Ledger.Report answers GET /api/usage from the aggregates alone: the work of a request is
// one read per period of its range (at most MaxReportPeriods), whatever the number of runs.
//
// Budgets: Ledger.Exceeded tells whether a principal used its budget of the current period
// (Config.Budget, or the budget its token gave, SetBudget). It is a local read: every
// Ledger watches the aggregates of the current period and keeps each principal's total in
// memory. A watch that lags (NATS slow or unreachable) leaves the last totals it saw: the
// check fails open, and the runs it let through are counted once recorded.
package usage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/metrics"
)

// Defaults of Config's zero fields, and bounds.
const (
	DefaultBucket    = "wsgateway_usage"
	DefaultPeriod    = 24 * time.Hour
	DefaultRetention = 90 * 24 * time.Hour
	// MaxReportPeriods bounds the periods one Report reads (its range over Config.Period).
	MaxReportPeriods = 400
	// MaxThreads and MaxModels bound the breakdowns of one aggregate: the usage of threads
	// (or models) beyond the first MaxThreads (MaxModels) of a period is counted under
	// Other.
	MaxThreads = 1000
	MaxModels  = 100
	// Other names the entry of a breakdown that counts the threads or models beyond its
	// bound, and runs without a thread or a model.
	Other = ""
	// recordTimeout bounds the recording of one run, retries included.
	recordTimeout = time.Minute
	// recentRuns is how many runs an aggregate remembers having added.
	recentRuns = 64
)

// Errors of the package; compare with errors.Is.
var (
	ErrConfig = errors.New("usage: invalid config")
	ErrRange  = errors.New("usage: invalid range")
)

// Config configures a Ledger. JetStream is required.
type Config struct {
	JetStream natsjs.JetStream
	// Bucket names the KV bucket (default DefaultBucket).
	Bucket string
	// Replicas of the bucket (default 1), as the run logs'.
	Replicas int
	// Period is the length of a budget's period and of the aggregates (default
	// DefaultPeriod); periods start at multiples of it since the Unix epoch (UTC midnight
	// for 24h).
	Period time.Duration
	// Retention is how long records and aggregates are kept after their last update
	// (default DefaultRetention); at least Period.
	Retention time.Duration
	// Budget is every principal's budget of tokens (totalTokens) per period; 0: none.
	// SetBudget overrides it for one principal.
	Budget int64
	// Agent names the gateway's agent in run records.
	Agent  string
	Logger *slog.Logger // default: discard
	// Now returns the current time (default time.Now); tests set it.
	Now func() time.Time
}

// Ledger records runs' usage and answers reports and budget checks. Its methods are safe for
// concurrent use; a nil *Ledger records nothing and refuses nothing.
type Ledger struct {
	cfg Config
	kv  natsjs.KeyValue
	log *slog.Logger

	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the records in flight
	watchWG sync.WaitGroup // the watch loop

	mu      sync.Mutex
	closed  bool             // Close began
	period  int64            // the period whose totals used holds (its start, Unix seconds)
	used    map[string]int64 // total tokens of the period, by principal hash
	budgets map[string]override
}

// override is a principal's budget from its token, until the token expires.
type override struct {
	tokens int64
	until  time.Time
}

// New creates or updates the bucket and starts the watch of the current period's aggregates.
// Close stops it.
func New(ctx context.Context, cfg Config) (*Ledger, error) {
	if cfg.JetStream == nil {
		return nil, fmt.Errorf("%w: JetStream is required", ErrConfig)
	}
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Period < time.Second || cfg.Period%time.Second != 0:
		return nil, fmt.Errorf("%w: period %v is not a whole number of seconds", ErrConfig, cfg.Period)
	case cfg.Retention < cfg.Period:
		return nil, fmt.Errorf("%w: retention %v shorter than the period %v", ErrConfig, cfg.Retention, cfg.Period)
	case cfg.Budget < 0:
		return nil, fmt.Errorf("%w: negative budget", ErrConfig)
	}
	kv, err := cfg.JetStream.CreateOrUpdateKeyValue(ctx, bucket.Config(cfg.Bucket, cfg.Retention, cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("usage: bucket %s: %w", cfg.Bucket, err)
	}
	l := &Ledger{cfg: cfg, kv: kv, log: cfg.Logger, used: map[string]int64{}, budgets: map[string]override{}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.watchWG.Add(1)
	go l.watch()
	return l, nil
}

// Close stops the watch and waits for the records in flight, until ctx ends; a run recorded
// from then on is logged, not recorded. It is idempotent.
func (l *Ledger) Close(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	l.closed = true // Record adds no more to wg
	l.mu.Unlock()
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("usage: records still in flight: %w", ctx.Err())
	}
	l.cancel()
	// The records and the watch stop with the ledger's context; a NATS call of theirs that
	// does not answer (JetStream unreachable) is not waited for past ctx.
	stopped := make(chan struct{})
	go func() {
		<-done
		l.watchWG.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		if err == nil {
			err = fmt.Errorf("usage: the ledger's watch still stopping: %w", ctx.Err())
		}
	}
	return err
}

// Run is the usage of one run, as Record takes it.
type Run struct {
	Principal, ThreadID, RunID string
	// Generation is the generation of the run's log (jetstream.RunInfo.Generation): a runId
	// started again (a resubmit) is a new generation, whose agent ran again, and counts
	// again; a second recording of one generation counts nothing.
	Generation uint64
	// Usage is the run's usage by model (Other for usage entries naming none).
	Usage map[string]metrics.Usage
}

// record is a run's record in the bucket.
type record struct {
	Principal string                   `json:"principal"`
	ThreadID  string                   `json:"threadId,omitempty"`
	RunID     string                   `json:"runId"`
	Gen       uint64                   `json:"generation"`
	Agent     string                   `json:"agent,omitempty"`
	Usage     map[string]metrics.Usage `json:"usage"`
	At        time.Time                `json:"at"`
	// Nonce tells this recording from another one of the same run.
	Nonce string `json:"nonce"`
}

// Counts are token counts and the runs they were reported in.
type Counts struct {
	Input  int64 `json:"inputTokens"`
	Output int64 `json:"outputTokens"`
	Total  int64 `json:"totalTokens"`
	Runs   int64 `json:"runs"`
}

func (c *Counts) add(o Counts) {
	c.Input, c.Output, c.Total, c.Runs = c.Input+o.Input, c.Output+o.Output, c.Total+o.Total, c.Runs+o.Runs
}

func countsOf(u metrics.Usage, runs int64) Counts {
	return Counts{Input: u.Input, Output: u.Output, Total: u.Total, Runs: runs}
}

// aggregate is a principal's usage of one period in the bucket.
type aggregate struct {
	Counts
	Threads map[string]Counts `json:"threads"`
	Models  map[string]Counts `json:"models"`
	// Recent holds the run hashes of the last recentRuns runs added, newest last.
	Recent []string `json:"recent"`
}

// Record records the usage of a run in the background: once per run, whoever records it
// again. A run that reported no usage is not recorded. The record is retried for about a
// minute while JetStream does not answer, then given up and logged.
func (l *Ledger) Record(run Run) {
	if l == nil || total(run.Usage) == (metrics.Usage{}) {
		return
	}
	at := l.cfg.Now()
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.wg.Add(1)
	}
	l.mu.Unlock()
	if closed {
		l.log.Warn("usage: a run ended after the ledger closed: its usage is not recorded", slog.String("runId", run.RunID))
		return
	}
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, recordTimeout)
		defer cancel()
		if err := l.record(ctx, run, at); err != nil {
			l.log.Warn("usage: recording a run's usage", slog.String("runId", run.RunID), slog.String("err", err.Error()))
		}
	}()
}

func total(byModel map[string]metrics.Usage) metrics.Usage {
	var u metrics.Usage
	for _, m := range byModel {
		u = u.Add(m)
	}
	return u
}

// record creates the run's record, then adds it to its aggregate.
func (l *Ledger) record(ctx context.Context, run Run, at time.Time) error {
	ph, rh := hash(run.Principal), hash(run.Principal+"\x00"+run.RunID+"\x00"+strconv.FormatUint(run.Generation, 10))
	nonce := strconv.FormatInt(at.UnixNano(), 36) + "-" + rh[:8]
	rec, _ := json.Marshal(record{Principal: run.Principal, ThreadID: run.ThreadID, RunID: run.RunID, Gen: run.Generation, Agent: l.cfg.Agent,
		Usage: run.Usage, At: at.UTC(), Nonce: nonce})
	key := "run." + ph + "." + rh
	err := retry(ctx, func() error {
		_, err := l.kv.Create(ctx, key, rec)
		if errors.Is(err, natsjs.ErrKeyExists) {
			// Ours, when an earlier attempt was stored but its answer lost.
			e, gerr := l.kv.Get(ctx, key)
			if gerr != nil {
				return gerr
			}
			var have record
			if json.Unmarshal(e.Value(), &have) == nil && have.Nonce == nonce {
				return nil
			}
			return errCounted
		}
		return err
	})
	if errors.Is(err, errCounted) {
		l.log.Debug("usage: run already recorded", slog.String("runId", run.RunID))
		return nil
	}
	if err != nil {
		return err
	}
	period := l.periodOf(at)
	akey := l.aggKey(period, ph)
	return retry(ctx, func() error {
		var agg aggregate
		var rev uint64
		e, err := l.kv.Get(ctx, akey)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &agg); err != nil {
				return fmt.Errorf("%w: aggregate %s: %w", errFinal, akey, err)
			}
		}
		if slices.Contains(agg.Recent, rh) {
			l.setUsed(period, ph, agg.Total)
			return nil // an earlier attempt added it
		}
		agg.add(run, rh)
		data, _ := json.Marshal(agg)
		if rev == 0 {
			_, err = l.kv.Create(ctx, akey, data)
		} else {
			_, err = l.kv.Update(ctx, akey, data, rev)
		}
		if err == nil {
			l.setUsed(period, ph, agg.Total)
		}
		return err
	})
}

// errCounted: the run's record exists, made by another recording.
var errCounted = errors.New("usage: run already recorded")

// errFinal wraps errors that retry does not retry.
var errFinal = errors.New("usage")

// retry runs op until it succeeds, fails with errCounted or errFinal, or ctx ends, backing
// off from 50 ms to 2 s.
func retry(ctx context.Context, op func() error) error {
	backoff := 50 * time.Millisecond
	for {
		err := op()
		if err == nil || errors.Is(err, errCounted) || errors.Is(err, errFinal) {
			return err
		}
		if errors.Is(err, natsjs.ErrKeyExists) || isWrongRevision(err) {
			continue // another gateway updated the aggregate first: read it again
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// isWrongRevision reports a compare-and-set refused for a wrong revision.
func isWrongRevision(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant)
}

// add adds run (of hash rh) to a.
func (a *aggregate) add(run Run, rh string) {
	u := total(run.Usage)
	a.Counts.add(countsOf(u, 1))
	if a.Threads == nil {
		a.Threads = map[string]Counts{}
	}
	if a.Models == nil {
		a.Models = map[string]Counts{}
	}
	addBounded(a.Threads, run.ThreadID, countsOf(u, 1), MaxThreads)
	for model, mu := range run.Usage {
		addBounded(a.Models, model, countsOf(mu, 1), MaxModels)
	}
	a.Recent = append(a.Recent, rh)
	if len(a.Recent) > recentRuns {
		a.Recent = a.Recent[len(a.Recent)-recentRuns:]
	}
}

// addBounded adds c to m[key], or to m[Other] when key is new and m holds max keys.
func addBounded(m map[string]Counts, key string, c Counts, max int) {
	if _, ok := m[key]; !ok && len(m) >= max {
		key = Other
	}
	v := m[key]
	v.add(c)
	m[key] = v
}

// hash names a principal or a run in keys: the first 16 bytes of its SHA-256, in hex.
func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:16])
}

// aggKey names the aggregate of principal hash ph in the period starting at period (Unix
// seconds); the key names the period's length too, so that aggregates of another
// Config.Period are never read as this one's.
func (l *Ledger) aggKey(period int64, ph string) string {
	return "agg." + strconv.FormatInt(int64(l.cfg.Period/time.Second), 10) + "." + strconv.FormatInt(period, 10) + "." + ph
}

// periodOf returns the start (Unix seconds) of the period holding t.
func (l *Ledger) periodOf(t time.Time) int64 {
	p := int64(l.cfg.Period / time.Second)
	s := t.Unix()
	return s - ((s%p)+p)%p
}

// setUsed raises the total of principal hash ph in period, if it is the period watched.
func (l *Ledger) setUsed(period int64, ph string, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if period == l.period && total > l.used[ph] {
		l.used[ph] = total
	}
}

// watch keeps the totals of the current period's aggregates, period after period, until
// Close.
func (l *Ledger) watch() {
	defer l.watchWG.Done()
	for l.ctx.Err() == nil {
		period := l.periodOf(l.cfg.Now())
		l.mu.Lock()
		if l.period != period {
			l.period, l.used = period, map[string]int64{}
		}
		l.mu.Unlock()
		end := time.Unix(period, 0).Add(l.cfg.Period)
		if err := l.watchPeriod(period, end); err != nil && l.ctx.Err() == nil {
			l.log.Warn("usage: watching the budgets' totals", slog.String("err", err.Error()))
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-l.ctx.Done():
				t.Stop()
			}
		}
	}
}

// watchPeriod follows the aggregates of period until end.
func (l *Ledger) watchPeriod(period int64, end time.Time) error {
	ctx, cancel := context.WithDeadline(l.ctx, end)
	defer cancel()
	w, err := l.kv.Watch(ctx, l.aggKey(period, "*"))
	if err != nil {
		return err
	}
	defer w.Stop()
	prefix := len(l.aggKey(period, ""))
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if e == nil || e.Operation() != natsjs.KeyValuePut {
				continue
			}
			var agg struct { // the total only: no maps built for the breakdowns
				Total int64 `json:"totalTokens"`
			}
			if json.Unmarshal(e.Value(), &agg) == nil && len(e.Key()) > prefix {
				l.setUsed(period, e.Key()[prefix:], agg.Total)
			}
		}
	}
}

// SetBudget gives principal a budget of tokens per period until the instant until (its
// token's expiry), in place of Config.Budget; 0 lifts its budget. A later call replaces it.
func (l *Ledger) SetBudget(principal string, tokens int64, until time.Time) {
	if l == nil {
		return
	}
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.budgets) >= 1024 && len(l.budgets)&1023 == 0 {
		for p, o := range l.budgets { // the expired overrides go, once per 1024 new ones
			if now.After(o.until) {
				delete(l.budgets, p)
			}
		}
	}
	l.budgets[principal] = override{tokens, until}
}

// ClearBudget forgets principal's budget from SetBudget: Config.Budget applies again.
func (l *Ledger) ClearBudget(principal string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	delete(l.budgets, principal)
	l.mu.Unlock()
}

// budget returns principal's budget per period, 0 for none. l.mu is held.
func (l *Ledger) budget(principal string, now time.Time) int64 {
	if o, ok := l.budgets[principal]; ok && !now.After(o.until) {
		return o.tokens
	}
	return l.cfg.Budget
}

// Exceeded reports whether principal has used its budget of the current period, from the
// totals in memory: no NATS round trip.
func (l *Ledger) Exceeded(principal string) bool {
	if l == nil {
		return false
	}
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.budget(principal, now)
	if b == 0 || l.period != l.periodOf(now) {
		return false
	}
	return l.used[hash(principal)] >= b
}

// Report is a principal's usage over a range of whole periods (GET /api/usage).
type Report struct {
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Period string    `json:"period"`
	Counts
	Threads []ThreadCounts `json:"threads"`
	Models  []ModelCounts  `json:"models"`
	// Budget is the principal's budget now, nil when it has none.
	Budget *Budget `json:"budget,omitempty"`
}

// ThreadCounts and ModelCounts are the entries of a report's breakdowns, largest total
// first; ThreadID or Model Other counts the rest (see MaxThreads).
type ThreadCounts struct {
	ThreadID string `json:"threadId"`
	Counts
}

type ModelCounts struct {
	Model string `json:"model"`
	Counts
}

// Budget is a principal's budget of the current period.
type Budget struct {
	Tokens    int64     `json:"tokens"`
	Used      int64     `json:"used"`
	Remaining int64     `json:"remaining"`
	Resets    time.Time `json:"resetsAt"`
}

// Range returns the whole periods that cover [from, to): from rounded down, to up to a
// period's start. Zero from and to are the current period; a zero from alone is one period
// before to, a zero to alone one period after from's period. It fails with ErrRange when to is not after from or the range spans more than
// MaxReportPeriods periods.
func (l *Ledger) Range(from, to time.Time) (time.Time, time.Time, error) {
	switch {
	case from.IsZero() && to.IsZero():
		from = l.cfg.Now()
	case from.IsZero():
		from = to.Add(-l.cfg.Period)
	}
	start := time.Unix(l.periodOf(from), 0).UTC()
	if to.IsZero() {
		to = start.Add(l.cfg.Period)
	}
	if !to.After(from) {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: to must be after from", ErrRange)
	}
	end := time.Unix(l.periodOf(to.Add(-time.Nanosecond)), 0).UTC().Add(l.cfg.Period)
	if n := end.Sub(start) / l.cfg.Period; n > MaxReportPeriods {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: the range spans %d periods of %v, more than %d", ErrRange, n, l.cfg.Period, MaxReportPeriods)
	}
	return start, end, nil
}

// Report returns principal's usage over the whole periods covering [from, to) (Range), read
// from its aggregates: one read per period.
func (l *Ledger) Report(ctx context.Context, principal string, from, to time.Time) (*Report, error) {
	start, end, err := l.Range(from, to)
	if err != nil {
		return nil, err
	}
	r := &Report{From: start, To: end, Period: l.cfg.Period.String(), Threads: []ThreadCounts{}, Models: []ModelCounts{}}
	ph := hash(principal)
	threads, models := map[string]Counts{}, map[string]Counts{}
	for p := start; p.Before(end); p = p.Add(l.cfg.Period) {
		e, err := l.kv.Get(ctx, l.aggKey(p.Unix(), ph))
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("usage: %w", err)
		}
		var agg aggregate
		if err := json.Unmarshal(e.Value(), &agg); err != nil {
			return nil, fmt.Errorf("usage: aggregate of %v: %w", p, err)
		}
		r.Counts.add(agg.Counts)
		for k, c := range agg.Threads {
			addBounded(threads, k, c, MaxThreads)
		}
		for k, c := range agg.Models {
			addBounded(models, k, c, MaxModels)
		}
	}
	for k, c := range threads {
		r.Threads = append(r.Threads, ThreadCounts{k, c})
	}
	for k, c := range models {
		r.Models = append(r.Models, ModelCounts{k, c})
	}
	slices.SortFunc(r.Threads, func(a, b ThreadCounts) int { return cmpCounts(a.Counts, b.Counts, a.ThreadID, b.ThreadID) })
	slices.SortFunc(r.Models, func(a, b ModelCounts) int { return cmpCounts(a.Counts, b.Counts, a.Model, b.Model) })
	r.Budget = l.budgetNow(ctx, principal)
	return r, nil
}

// cmpCounts orders entries by total, largest first, then by name.
func cmpCounts(a, b Counts, an, bn string) int {
	if a.Total != b.Total {
		if a.Total > b.Total {
			return -1
		}
		return 1
	}
	switch {
	case an < bn:
		return -1
	case an > bn:
		return 1
	}
	return 0
}

// budgetNow returns principal's budget of the current period, nil for none; its use is
// read from the period's aggregate (the watched total when the read fails).
func (l *Ledger) budgetNow(ctx context.Context, principal string) *Budget {
	now := l.cfg.Now()
	period := l.periodOf(now)
	ph := hash(principal)
	l.mu.Lock()
	tokens := l.budget(principal, now)
	var used int64
	if l.period == period {
		used = l.used[ph]
	}
	l.mu.Unlock()
	if tokens == 0 {
		return nil
	}
	if e, err := l.kv.Get(ctx, l.aggKey(period, ph)); err == nil {
		var agg aggregate
		if json.Unmarshal(e.Value(), &agg) == nil {
			used = max(used, agg.Total)
		}
	}
	return &Budget{Tokens: tokens, Used: used, Remaining: max(tokens-used, 0), Resets: time.Unix(period, 0).UTC().Add(l.cfg.Period)}
}
