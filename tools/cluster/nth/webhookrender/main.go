// Command webhookrender renders webhook bodies with aws-node-termination-handler's own webhook code, for the
// tests that hold queue-processor's Go-template renderer to NTH's (tests/migration/test_webhook.py).
//
// Input, one JSON object per line on stdin: {"template": "...", "event": {<monitor.InterruptionEvent fields,
// by their Go names; StartTime and EndTime in RFC 3339>}}. Output, one JSON object per line on stdout:
// {"valid": "<ValidateWebhookConfig's error, or empty>", "sent": <whether webhook.Post sent a request>,
// "body": "<the request body>"}. webhook.Post is NTH's (pkg/webhook), posting to a local httptest server;
// NodeMetadata is empty, as it is in NTH's queue-processor mode (no instance metadata).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/aws/aws-node-termination-handler/pkg/config"
	"github.com/aws/aws-node-termination-handler/pkg/ec2metadata"
	"github.com/aws/aws-node-termination-handler/pkg/monitor"
	"github.com/aws/aws-node-termination-handler/pkg/webhook"
	"github.com/rs/zerolog"
)

type request struct {
	Template string                    `json:"template"`
	Event    monitor.InterruptionEvent `json:"event"`
}

type response struct {
	Valid string `json:"valid"`
	Sent  bool   `json:"sent"`
	Body  string `json:"body"`
}

func main() {
	zerolog.SetGlobalLevel(zerolog.Disabled)
	bodies := make(chan string, 1)
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies <- string(body)
	}))
	defer server.Close()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "webhookrender: bad input line:", err)
			os.Exit(2)
		}
		cfg := config.Config{
			WebhookURL:      server.URL,
			WebhookTemplate: req.Template,
			WebhookHeaders:  `{"Content-type":"application/json"}`,
		}
		var resp response
		if err := webhook.ValidateWebhookConfig(cfg); err != nil {
			resp.Valid = err.Error()
		}
		event := req.Event
		webhook.Post(ec2metadata.NodeMetadata{}, &event, cfg)
		select {
		case body := <-bodies:
			resp.Sent, resp.Body = true, body
		default:
		}
		if err := out.Encode(resp); err != nil {
			os.Exit(2)
		}
	}
}
