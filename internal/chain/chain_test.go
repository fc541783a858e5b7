package chain_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/chain"
)

// build makes a chain of n events the way an appender does, and its head.
func build(t *testing.T, n int) ([]chain.Link, chain.Head) {
	t.Helper()
	var links []chain.Link
	var prev []byte
	for i := 1; i <= n; i++ {
		f := map[string]any{"chain": "c", "seq": int64(i), "at": chain.Time(time.Date(2026, 11, 1, 0, 0, i, 123456789, time.UTC)),
			"kind": "k", "actor": "a", "data": json.RawMessage(`{"amount": 50000.5, "note": "<b>&"}`)}
		h, err := chain.Hash(prev, f)
		require.NoError(t, err)
		links = append(links, chain.Link{Seq: int64(i), Prev: prev, Hash: h, Fields: f})
		prev = h
	}
	return links, chain.Head{Seq: int64(n), Hash: prev}
}

func verify(t *testing.T, links []chain.Link, head *chain.Head) (int64, string) {
	t.Helper()
	var v chain.Verifier
	for _, l := range links {
		v.Add(l)
	}
	seq, problem, ok, err := v.End(head)
	require.NoError(t, err)
	require.Equal(t, ok, problem == "")
	return seq, problem
}

func TestHashIsCanonical(t *testing.T) {
	a, err := chain.Hash(nil, map[string]any{"data": json.RawMessage(`{"b":1,"a":"<"}`), "seq": 1})
	require.NoError(t, err)
	b, err := chain.Hash(nil, map[string]any{"seq": 1, "data": json.RawMessage(`{ "a": "\u003c", "b": 1.0 }`)})
	require.NoError(t, err)
	require.Equal(t, a, b, "the same event however its JSON is spelled (as jsonb gives it back)")
	c, err := chain.Hash([]byte{1}, map[string]any{"data": json.RawMessage(`{"b":1,"a":"<"}`), "seq": 1})
	require.NoError(t, err)
	require.NotEqual(t, a, c, "the previous hash is covered")
}

func TestVerifier(t *testing.T) {
	links, head := build(t, 3)
	_, problem := verify(t, links, &head)
	require.Empty(t, problem)

	for field, v := range map[string]any{"chain": "d", "seq": int64(9), "at": chain.Time(time.Now()), "kind": "x", "actor": "m", "data": json.RawMessage(`{}`)} {
		t.Run("field "+field, func(t *testing.T) {
			links, head := build(t, 3)
			links[1].Fields[field] = v
			seq, problem := verify(t, links, &head)
			require.EqualValues(t, 2, seq)
			require.Contains(t, problem, "contents")
		})
	}
	t.Run("removed last", func(t *testing.T) {
		links, head := build(t, 3)
		seq, problem := verify(t, links[:2], &head)
		require.EqualValues(t, 2, seq)
		require.Contains(t, problem, "last events were removed")
	})
	t.Run("removed middle", func(t *testing.T) {
		links, head := build(t, 3)
		seq, problem := verify(t, []chain.Link{links[0], links[2]}, &head)
		require.EqualValues(t, 3, seq)
		require.Contains(t, problem, "sequence gap")
	})
	t.Run("reordered", func(t *testing.T) {
		links, head := build(t, 3)
		links[0].Seq, links[1].Seq = 2, 1
		seq, problem := verify(t, []chain.Link{links[1], links[0], links[2]}, &head)
		require.EqualValues(t, 1, seq)
		require.Contains(t, problem, "prev_hash")
	})
	t.Run("no head", func(t *testing.T) {
		links, _ := build(t, 3)
		_, problem := verify(t, links, nil)
		require.Contains(t, problem, "no recorded head")
	})
	t.Run("past the head", func(t *testing.T) {
		links, _ := build(t, 3)
		short, _ := build(t, 2)
		_, head := build(t, 2)
		require.Equal(t, short[1].Hash, head.Hash)
		seq, problem := verify(t, links, &head)
		require.EqualValues(t, 3, seq)
		require.Contains(t, problem, "past its recorded head")
	})
	t.Run("head hash", func(t *testing.T) {
		links, head := build(t, 3)
		head.Hash = []byte{0}
		_, problem := verify(t, links, &head)
		require.Contains(t, problem, "head's hash")
	})
}
