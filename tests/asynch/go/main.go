// A client of model-asynch written the way the original Go service's callers are: standard
// library only, request structs marshalled whole (no omitempty, nil slices and interfaces),
// every reply decoded into {Code int; Message string; Data T} and checked with Code != 0.
//
// It runs the seed 003 walk-through against a server and exits 1 at the first step that a
// caller of the Go service would have seen work and that fails here:
//
//	asynchgo -base http://127.0.0.2:23492 -model http://127.0.0.1:9000
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Reply is the envelope of every answer.
type Reply struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

type FormField struct {
	Field    string `json:"field"`
	Label    string `json:"label"`
	Type     string `json:"type"`
	Required bool   `json:"required"`
}

// Model is both the createModel / updateModel body and getModel's data.
type Model struct {
	ModelName            string      `json:"modelName"`
	ModelsType           string      `json:"modelsType"`
	Form                 []FormField `json:"form"`
	BaseUrl              string      `json:"baseUrl"`
	Route                string      `json:"route"`
	HttpMethod           string      `json:"httpMethod"`
	HeadMsg              string      `json:"headMsg"`
	Enabled              int         `json:"enabled"`
	MaxConcurrency       int         `json:"maxConcurrency"`
	QueueLimit           int         `json:"queueLimit"`
	TimeoutSeconds       int         `json:"timeoutSeconds"`
	ExpectedSeconds      int         `json:"expectedSeconds"`
	RetryTimes           int         `json:"retryTimes"`
	RetryQueueMaxSeconds int         `json:"retryQueueMaxSeconds"`
	AutoCleanSeconds     int         `json:"autoCleanSeconds"`
	Remark               string      `json:"remark"`
}

type CreateTaskReq struct {
	ModelName      string      `json:"modelName"`
	RequestPayload interface{} `json:"requestPayload"`
	BizName        string      `json:"bizName"`
	CallbackUrl    string      `json:"callbackUrl"`
	ModelKey       string      `json:"modelKey"`
}

type CreateTaskRes struct {
	TaskId string `json:"task_id"`
}

type TaskResult struct {
	TaskId   string `json:"task_id"`
	State    int    `json:"state"`
	OssFile  string `json:"oss_file"`
	FileType string `json:"file_type"`
	Text     string `json:"text"`
}

type GetTaskBatchReq struct {
	TaskIds []string `json:"taskIds"`
}

type RunWorkReq struct {
	BatchSize int `json:"batchSize"`
}

var (
	base   string
	client = &http.Client{Timeout: 30 * time.Second}
)

// call sends body (nil: none) and decodes the reply's data into out (nil: ignored).
func call(method, path string, body interface{}, out interface{}) error {
	var reader *bytes.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(raw)
	} else {
		reader = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, base+path, reader)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var reply Reply
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
		return fmt.Errorf("%s %s: decoding the reply: %w", method, path, err)
	}
	if reply.Code != 0 {
		return &ReplyError{reply.Code, reply.Message}
	}
	if out != nil {
		if err := json.Unmarshal(reply.Data, out); err != nil {
			return fmt.Errorf("%s %s: decoding data %s: %w", method, path, reply.Data, err)
		}
	}
	return nil
}

type ReplyError struct {
	Code    int
	Message string
}

func (e *ReplyError) Error() string { return fmt.Sprintf("code %d: %s", e.Code, e.Message) }

func getModel(name string) (Model, error) {
	var m Model
	err := call("GET", "/model/getModel?modelName="+url.QueryEscape(name), nil, &m)
	return m, err
}

func check(step string, err error) {
	if err != nil {
		fmt.Printf("FAIL %s: %v\n", step, err)
		os.Exit(1)
	}
	fmt.Printf("ok   %s\n", step)
}

func expect(cond bool, format string, args ...interface{}) error {
	if cond {
		return nil
	}
	return fmt.Errorf(format, args...)
}

func waitDone(taskId string) (TaskResult, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var r TaskResult
		if err := call("GET", "/task/getTaskResult?taskId="+taskId, nil, &r); err != nil {
			return r, err
		}
		if r.State >= 2 || time.Now().After(deadline) {
			return r, expect(r.State == 2, "task %s ended in state %d", taskId, r.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func main() {
	modelURL := flag.String("model", "", "base URL of the model service")
	flag.StringVar(&base, "base", "", "base URL of model-asynch")
	flag.Parse()

	// Seed 003, step one: its own example, on a fresh database.
	seed := Model{
		ModelName: "model-service", ModelsType: "1,2,3",
		Form:    []FormField{{Field: "prompt", Label: "Prompt", Type: "text", Required: true}},
		BaseUrl: *modelURL, Route: "/api/v1/chat", HttpMethod: "POST",
		HeadMsg: "API_KEY:model-key,API_STATE:true,API_NUM:123", Enabled: 1,
		MaxConcurrency: 5, QueueLimit: 20, TimeoutSeconds: 1800, ExpectedSeconds: 600,
		RetryTimes: 3, RetryQueueMaxSeconds: 600, AutoCleanSeconds: 3600,
		Remark: "Model-Service 模型服务",
	}
	check("createModel (the seed's example)", call("POST", "/model/createModel", seed, nil))

	got, err := getModel(seed.ModelName)
	check("getModel", err)
	check("getModel: form is a JSON array", expect(len(got.Form) == 1 && got.Form[0].Field == "prompt", "form %+v", got.Form))

	// The whole struct with one field changed: the zero values are not a change.
	check("updateModel (one field set)", call("POST", "/model/updateModel", Model{ModelName: seed.ModelName, MaxConcurrency: 8}, nil))
	got, err = getModel(seed.ModelName)
	check("getModel after the update", err)
	check("updateModel kept the other fields", expect(
		got.MaxConcurrency == 8 && got.Enabled == 1 && got.Route == seed.Route &&
			got.HeadMsg == seed.HeadMsg && got.RetryTimes == 3 && got.RetryQueueMaxSeconds == 600 &&
			got.AutoCleanSeconds == 3600 && len(got.Form) == 1,
		"after the update: %+v", got))

	// A model created without autoCleanSeconds (and other fields) gets the defaults.
	minimal := Model{ModelName: "minimal", BaseUrl: *modelURL, Route: "/gen", Enabled: 1, MaxConcurrency: 2}
	check("createModel (fields unset)", call("POST", "/model/createModel", minimal, nil))
	got, err = getModel(minimal.ModelName)
	check("getModel (fields unset)", err)
	check("unset fields took their defaults", expect(
		got.AutoCleanSeconds == 3600 && got.TimeoutSeconds == 1800 && got.QueueLimit == 100 &&
			got.ExpectedSeconds == 600 && got.HttpMethod == "POST",
		"defaults: %+v", got))

	var models []Model
	check("listModel?page=0&pageSize=0", call("GET", "/model/listModel?page=0&pageSize=0", nil, &models))
	check("listModel lists both", expect(len(models) == 2, "listModel: %d models", len(models)))

	var empty, filled CreateTaskRes
	check("createTask (nil requestPayload)", call("POST", "/task/createTask", CreateTaskReq{ModelName: seed.ModelName, BizName: "order"}, &empty))
	payload := map[string]interface{}{"prompt": "a cat"}
	check("createTask", call("POST", "/task/createTask", CreateTaskReq{ModelName: seed.ModelName, RequestPayload: payload, BizName: "order"}, &filled))
	check("createTask returned task ids", expect(empty.TaskId != "" && filled.TaskId != "", "ids %q %q", empty.TaskId, filled.TaskId))
	check("runWork", call("POST", "/task/runWork", RunWorkReq{}, nil))

	done, err := waitDone(filled.TaskId)
	check("getTaskResult until success", err)
	check("the model got the payload and the headers", expect(
		strings.Contains(done.Text, `"prompt":"a cat"`) && strings.Contains(done.Text, `"api_key":"model-key"`),
		"reply text %s", done.Text))
	_, err = waitDone(empty.TaskId)
	check("the nil payload task succeeded", err)

	var batch []TaskResult
	check("getTaskBatch", call("POST", "/task/getTaskBatch", GetTaskBatchReq{TaskIds: []string{filled.TaskId, empty.TaskId, "no-such-task"}}, &batch))
	check("getTaskBatch claimed both (2 -> 4)", expect(
		len(batch) == 2 && batch[0].State == 4 && batch[1].State == 4 && batch[0].OssFile != "",
		"batch %+v", batch))

	var refused *ReplyError
	_, err = getModel("no-such-model")
	check("an error decodes into {Code int}", expect(errors.As(err, &refused) && refused.Message != "", "got %v", err))

	// Disabling: getModel's struct with Enabled set to 0, sent back whole.
	got, err = getModel(seed.ModelName)
	check("getModel before disabling", err)
	got.Enabled = 0
	check("updateModel (disable)", call("POST", "/model/updateModel", got, nil))
	got, err = getModel(seed.ModelName)
	check("getModel after disabling", err)
	check("the model is disabled", expect(got.Enabled == 0 && got.MaxConcurrency == 8, "after disabling: %+v", got))
	err = call("POST", "/task/createTask", CreateTaskReq{ModelName: seed.ModelName, BizName: "order"}, nil)
	check("createTask on a disabled model is refused", expect(errors.As(err, &refused), "got %v", err))
	fmt.Println("all steps passed")
}
